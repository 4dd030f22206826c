"""Where an agent keeps what its sandbox uids must reach: its runtime dir.

A state directory holds what must stay private (the agent's database and lock; for
``serve`` also the keys and tokens), so it may be anywhere, root's home included. Each
sandbox uid must reach its own home: bubblewrap runs as that uid and binds ``HOME``,
``HOME.passwd`` and ``HOME.group``, so every directory above them must let every uid
through. Those live in a runtime dir, one per state dir, under a runtime root that every
uid may traverse and only root may write::

    RUNTIME_ROOT/                0711  default /var/lib/sandboxctl/runtime (--runtime-root,
                                       SANDBOXCTL_RUNTIME_ROOT)
    RUNTIME_ROOT/KEY/            0711  the runtime dir: KEY = 16 hex digits of the SHA-256
                                       of the state dir's real path
    RUNTIME_ROOT/KEY/state-dir   0600  that real path: whose runtime dir this is
    RUNTIME_ROOT/KEY/owner.lock  0600  held by its agent while it starts and runs
    RUNTIME_ROOT/KEY/homes/      0711  the sandbox homes (the agent makes it)
    RUNTIME_ROOT/uids/           0700  host-wide uid claims (uids.py) and their lock
    STATE_DIR/runtime                  a symlink to RUNTIME_ROOT/KEY

Every directory from ``/`` down to the runtime root must be root's, let others through
(o+x) and let nobody else write in it (group or other write only with the sticky bit,
as on /tmp), or a local user could swap a directory under root's feet; ``check_root``
says which one fails.

The runtime dir is reused by every start of the same state dir. Its agent holds
``owner.lock`` (0600) from before it first writes in it, at the very start of its start,
until its process exits: that lock, not the state dir, proves the agent alive, for a state
dir may be missing while its agent runs (not made yet on a first start, deleted under a
running agent, or out of sight in another mount namespace). ``collect_gone`` removes a
runtime dir only when all of these hold, and only once its caller's own start has
succeeded (a refused start changes nothing): no process holds its owner lock, its state
dir does not exist, and no process runs as a uid it claims (a sandbox left running). It
is judged under the uid claims' lock, which ``prepare`` takes too, so an owner is never
half way into its runtime dir while it is judged. A runtime dir with no owner lock (made
by a sandboxctl from before it) is never removed: nothing proves its agent stopped.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sandboxctl.core.errors import ConfigurationError
from sandboxctl.sandboxd import procfs
from sandboxctl.sandboxd.errors import StateDirInUse
from sandboxctl.sandboxd.uids import UidClaims
from sandboxctl.secretfiles import write_private

log = logging.getLogger("sandboxctl.sandboxd")

DEFAULT_RUNTIME_ROOT = Path("/var/lib/sandboxctl/runtime")
RUNTIME_ROOT_ENV = "SANDBOXCTL_RUNTIME_ROOT"
LINK = "runtime"  # in the state dir
OWNER_FILE = "state-dir"
OWNER_LOCK = "owner.lock"
HOMES = "homes"
UIDS = "uids"
KEY_DIGITS = 16
STATE_LOCK = "sandboxd.lock"  # in an agent's state dir, held while it runs (agent.py)


@dataclass(frozen=True, slots=True)
class RuntimeDir:
    """The runtime dir of one state dir (both real paths)."""

    root: Path
    state_dir: Path

    @property
    def path(self) -> Path:
        digest = hashlib.sha256(os.fsencode(self.state_dir)).hexdigest()
        return self.root / digest[:KEY_DIGITS]

    @property
    def homes(self) -> Path:
        return self.path / HOMES

    @property
    def uids(self) -> Path:
        return self.root / UIDS

    @property
    def link(self) -> Path:
        return self.state_dir / LINK


def runtime_dir(state_dir: Path, root: Path) -> RuntimeDir:
    """The runtime dir of ``state_dir`` (which need not exist yet) under ``root``."""
    return RuntimeDir(root=root.resolve(), state_dir=state_dir.resolve())


def traversal_problem(path: Path) -> str | None:
    """Why some uid other than root cannot reach ``path`` (every existing directory from
    ``/`` down to it must have o+x), or None."""
    for directory in (*reversed(path.parents), path):
        try:
            mode = stat.S_IMODE(directory.stat().st_mode)
        except FileNotFoundError:
            return None
        if not mode & stat.S_IXOTH:
            return f"sandbox uids cannot traverse {directory} (mode {mode:04o})"
    return None


def check_root(root: Path) -> None:
    """Refuse (ConfigurationError) a runtime root that sandbox uids cannot traverse or
    that someone other than root could change; the directories still missing are made
    safe by :func:`prepare`. Writes nothing."""
    problem = shared_path_problem(root)
    if problem:
        raise ConfigurationError(
            f"--runtime-root {root}: {problem}; pick a runtime root that every uid may "
            f"traverse and only root may write (--runtime-root or {RUNTIME_ROOT_ENV}; "
            f"default {DEFAULT_RUNTIME_ROOT})"
        )


def shared_path_problem(path: Path) -> str | None:
    """Why ``path`` is no place for what sandbox uids read (the first directory from
    ``/`` down to it that is not root's, that others cannot traverse, or that others may
    write), or None; directories still missing are not judged."""
    real = path.resolve()
    for directory in (*reversed(real.parents), real):
        try:
            info = directory.stat()
        except FileNotFoundError:
            return None
        problem = _unsafe(directory, info, last=directory == real)
        if problem:
            return problem
    return None


def check_reach(runtime: RuntimeDir, uid: int) -> None:
    """Refuse (ConfigurationError, the line ``check_root`` gives) a runtime dir that
    ``uid``, the first sandbox uid, cannot traverse after all: modes are not all that
    decides (a directory whose group is that uid's, an ACL, a security module). Asked of
    the kernel, as that uid, with no supplementary groups."""
    probe = subprocess.run(
        ["test", "-x", str(runtime.path)],
        user=uid,
        group=uid,
        extra_groups=[],
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )
    if probe.returncode != 0:
        raise ConfigurationError(
            f"--runtime-root {runtime.root}: sandbox uids cannot traverse {runtime.path} "
            f"(uid {uid} was refused); pick a runtime root that every uid may traverse and "
            f"only root may write (--runtime-root or {RUNTIME_ROOT_ENV}; default "
            f"{DEFAULT_RUNTIME_ROOT})"
        )


class OwnerLock:
    """A runtime dir's owner lock, held until :meth:`close` (or the process's exit)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> OwnerLock:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def prepare(runtime: RuntimeDir) -> OwnerLock:
    """Make the runtime root (0711 for each missing directory) and the runtime dir
    (0711), take its owner lock and write its owner file. Keep the lock until the agent
    has stopped: while it is held no other start collects the runtime dir. StateDirInUse
    when another process holds it (an agent of this state dir runs, or is starting)."""
    check_root(runtime.root)
    _make_dirs(runtime.root)
    check_root(runtime.root)  # what another process made meanwhile, too
    with UidClaims(runtime.uids, runtime.path).locked():
        _make_private_dir(runtime.path)
        lock = _lock_owner(runtime)
        try:
            write_private(runtime.path / OWNER_FILE, f"{runtime.state_dir}\n")
        except BaseException:
            lock.close()
            raise
    return lock


def link(runtime: RuntimeDir) -> None:
    """Make the state dir (0700) if it is missing, and point its ``runtime`` symlink at
    the runtime dir."""
    if not runtime.state_dir.exists():
        runtime.state_dir.mkdir(mode=0o700, parents=True)
        runtime.state_dir.chmod(0o700)
    _point(runtime.link, runtime.path)


def collect_gone(runtime: RuntimeDir) -> None:
    """Remove every other runtime dir under the root whose agent is gone for good (see
    the module's doc), with its uid claims. Call it once the caller's start succeeded."""
    claims = UidClaims(runtime.uids, runtime.path)
    with claims.locked():
        for entry in sorted(runtime.root.iterdir()):
            if entry == runtime.path or entry.name == UIDS or entry.is_symlink():
                continue
            owner = _owner_of(entry)
            if owner is None or owner.exists():
                continue  # not a runtime dir, or its agent may start again and adopt
            with _owner_lock_if_free(entry) as free:
                if free is None:
                    log.info(
                        "kept %s, the runtime dir of %s, which is gone: it has no owner "
                        "lock (made by an older sandboxctl), so its agent may still run; "
                        "remove it by hand once it does not",
                        entry,
                        owner,
                    )
                if not free:
                    continue
                held = claims.held(entry)
                if any(procfs.pids_of_uid(uid) for uid in held):
                    continue  # a sandbox of it still runs, which no agent knows
                for uid in held:
                    claims.drop_for(entry, uid)
                shutil.rmtree(entry, ignore_errors=True)
            log.info("removed %s, the runtime dir of %s, which is gone", entry, owner)


def in_use(path: Path) -> bool:
    """Whether the runtime dir ``path`` may still serve an agent: ``collect_gone`` would
    keep it for its owner (its owner lock is held or missing, or its state dir exists)."""
    with UidClaims(path.parent / UIDS, path).locked():  # never in an owner's way
        owner = _owner_of(path)
        if owner is None or owner.exists():
            return owner is not None
        with _owner_lock_if_free(path) as free:
            return not free


def lock_held(lock: Path) -> bool:
    """Whether a process holds the flock of ``lock`` (an owner lock, an agent's
    ``STATE_LOCK``): probed, never kept; False when there is no such file."""
    with _lock_if_free(lock) as free:
        return free is False


def refuse_state_dir_in_use(state_dir: Path, runtime: RuntimeDir, agent_dir: Path) -> None:
    """StateDirInUse when a running agent holds ``state_dir``: its runtime dir's owner
    lock is held (a ``serve`` or an agent starting or running), or the ``STATE_LOCK`` of
    the agent's own state dir ``agent_dir`` (``state_dir`` itself, or a directory in it).
    Probed, not taken, and nothing is created: a start's checks before its ports write
    nothing (``prepare`` and the agent take both locks for good later)."""
    for lock in (runtime.path / OWNER_LOCK, agent_dir / STATE_LOCK):
        if lock_held(lock):
            raise state_dir_in_use(state_dir)


def state_dir_in_use(state_dir: Path) -> StateDirInUse:
    """The refusal of a start whose state dir another running agent holds."""
    return StateDirInUse(f"--state-dir {state_dir} is in use by another running agent")


def _lock_owner(runtime: RuntimeDir) -> OwnerLock:
    """Under the claims lock: hold the owner lock of ``runtime``, or StateDirInUse."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(runtime.path / OWNER_LOCK, flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise state_dir_in_use(runtime.state_dir) from None
    return OwnerLock(fd)


def _owner_of(entry: Path) -> Path | None:
    """The state dir a runtime dir names, or None when ``entry`` is not one."""
    try:
        owner = Path((entry / OWNER_FILE).read_text().strip())
    except OSError:
        return None
    return owner if owner.is_absolute() else None


@contextlib.contextmanager
def _owner_lock_if_free(entry: Path) -> Iterator[bool | None]:
    """Under the claims lock: True, holding it, when no process holds ``entry``'s owner
    lock (its agent is neither starting nor running); False when one does; None when it
    has none."""
    with _lock_if_free(entry / OWNER_LOCK) as free:
        yield free


@contextlib.contextmanager
def _lock_if_free(lock: Path) -> Iterator[bool | None]:
    """True, holding it, when no process holds the flock of ``lock``; False when one
    does; None when there is no such file. Creates nothing."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        yield None
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _unsafe(directory: Path, info: os.stat_result, last: bool) -> str | None:
    mode = stat.S_IMODE(info.st_mode)
    if not stat.S_ISDIR(info.st_mode):
        return f"{directory} is not a directory"
    if info.st_uid not in (0, os.geteuid()):
        return f"{directory} is owned by uid {info.st_uid}, not root"
    if not mode & stat.S_IXOTH:
        return f"sandbox uids cannot traverse {directory} (mode {mode:04o})"
    if mode & 0o022 and (last or not mode & stat.S_ISVTX):
        return f"others may write in {directory} (mode {mode:04o})"
    return None


def _make_dirs(root: Path) -> None:
    missing = [d for d in (root, *root.parents) if not d.exists()]
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o711)
            directory.chmod(0o711)  # not the umask's


def _make_private_dir(path: Path) -> None:
    """``path`` as a directory of root's that others may only traverse (0711)."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o711)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid not in (0, os.geteuid()):
        raise ConfigurationError(f"{path} is not a directory of root's; remove it")
    if stat.S_IMODE(info.st_mode) != 0o711:
        path.chmod(0o711)


def _point(link: Path, target: Path) -> None:
    """``link`` -> ``target``, replaced at once when it points elsewhere."""
    with contextlib.suppress(OSError):
        if os.readlink(link) == str(target):
            return
    if link.exists() and not link.is_symlink():
        log.warning("%s is not a symlink: not pointing it at %s", link, target)
        return
    scratch = link.with_name(f".{link.name}.{os.getpid()}")
    scratch.unlink(missing_ok=True)
    scratch.symlink_to(target)
    os.replace(scratch, link)

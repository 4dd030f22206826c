"""The bubblewrap runtime: each sandbox is an unprivileged user namespace of its own uid.

How a sandbox starts (``launch_command``), as root, for uid ``UID``::

    /bin/sh -c 'echo $$ >.../memory/sandboxctl/ID/cgroup.procs && ... ; exec "$@"' \\
      sandboxctl-join \\
      [prlimit --nproc=N:N --as=BYTES:BYTES --]                    # rlimit mode only
      setpriv --reuid=UID --regid=UID --clear-groups -- \\
      bwrap --unshare-user --disable-userns --unshare-pid --unshare-ipc --unshare-uts \\
            --unshare-net --unshare-cgroup-try --hostname NAME \\
            --ro-bind ROOT / --proc /proc --dev /dev \\
            --size TMP_BYTES --tmpfs /dev/shm --remount-ro /dev [--size 1M --tmpfs /run] \\
            --size TMP_BYTES --tmpfs /tmp \\
            --tmpfs /home --perms 0700 --size HOME_BYTES --tmpfs /home/user --remount-ro /home \\
            --ro-bind HOME.passwd /etc/passwd --ro-bind HOME.group /etc/group \\
            [--ro-bind HOME.hosts /etc/hosts] [--ro-bind RESOLV_CONF /etc/resolv.conf] \\
            --chdir /home/user --setenv HOME /home/user --new-session --info-fd I -- \\
            /bin/sh -c 'printf R; exec sleep infinity >/dev/null'

Readiness is the ``R`` on the command's stdout, a pipe we read one byte from (a pipe,
not a numbered fd: dash accepts only single-digit fds in redirections).

bwrap itself runs as the sandbox uid, never as root: its user namespace maps only
``UID`` to itself, so every process of the sandbox is ``UID`` on the host, has no
capabilities (CapEff 0), runs with NoNewPrivs and cannot create further user
namespaces. It sees its own pids only, its own /tmp and /dev/shm (tmpfs of ``tmp_bytes``),
a read-only /home with just its home in it (a tmpfs of ``home_bytes``: every place it can
write is bounded, and none of it is on the host's disk), the read-only ROOT elsewhere,
and a network namespace of its own holding only ``lo`` (the agent's network adds a veth,
see ``network/``).
``--tmpfs /run`` hides the host's sockets in /run (a read-only bind does not stop
``connect`` on a unix socket). What stays visible: the rest of the host filesystem
read-only (when ROOT is "/") under normal permissions, including a read-only /sys.

The launcher (the outer bwrap) stays our child and waits for the sandbox's init (the
inner bwrap, pid 1 of the namespace = ``Identity.pid``); the runtime reaps it when it
exits (checked on every call, awaited by ``destroy``), so none stays a zombie.
Neither ``--die-with-parent`` nor ``--as-pid-1`` is used: a sandbox survives the
agent, and a restarted agent finds it again from its ``Identity``. Launchers of
sandboxes adopted after a restart are the host init's to reap.

Limits: with cgroups (``limits_mode == "cgroup-v1"``, see ``cgroups.py``) memory
(memory+swap), pids and cpu are limited per sandbox, and freezing uses the cgroup
freezer. Without them (``"rlimit"``) each process gets RLIMIT_AS = memory (per process,
not in total) and the uid RLIMIT_NPROC = max_processes (per uid, so per sandbox), there
is no CPU limit, and freezing sends SIGSTOP/SIGCONT to every process of the namespace
(which a process can observe, e.g. a shell's job control).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from sandboxctl.envd.host import SANDBOX_HOME, SANDBOX_USER, Command, Entry
from sandboxctl.sandboxd import procfs
from sandboxctl.sandboxd.cgroups import Cgroups, CgroupUsage, join_command
from sandboxctl.sandboxd.entering import (
    DEFAULT_PATH,
    FAILED_TO_ENTER,
    HOST_ENV,
    command_script,
    shim_argv,
)
from sandboxctl.sandboxd.hostlimits import PTYS_PER_SANDBOX
from sandboxctl.sandboxd.runtime import Identity, Limits, RuntimeFailure, SandboxSpec

START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
FREEZE_TIMEOUT = 5.0
RUN_BYTES = 1 << 20  # /run: a few pid and lock files at most
# What a template's root must hold for bwrap to mount over (or bind onto) it.
MOUNT_POINTS = ("proc", "dev", "tmp", "home", "etc/passwd", "etc/group")

INSTALL_HINTS = {
    "bwrap": "install bubblewrap: apt-get install bubblewrap",
    "setpriv": "install util-linux: apt-get install util-linux",
    "nsenter": "install util-linux: apt-get install util-linux",
    "prlimit": "install util-linux: apt-get install util-linux",
    "mount": "install mount: apt-get install mount",
}


def open_files(limits: Limits) -> int:
    """Open files per process of a sandbox: its size class's, or less when the agent's
    own hard limit is lower (a process may lower its limit, never raise it)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return limits.open_files if hard == resource.RLIM_INFINITY else min(limits.open_files, hard)


def ready_script(limits: Limits) -> str:
    """The sandbox's init: at most its open files, then ``R`` on stdout (the readiness
    pipe), then sleep for good."""
    return f"ulimit -n {open_files(limits)}; printf R; exec sleep infinity >/dev/null"


def find_tools(names: Sequence[str]) -> dict[str, str]:
    """Absolute paths of the host tools a runtime needs; RuntimeFailure names the fix."""
    found: dict[str, str] = {}
    for name in names:
        path = shutil.which(name, path=DEFAULT_PATH)
        if path is None:
            raise RuntimeFailure(f"{name} not found: {INSTALL_HINTS.get(name, name)}")
        found[name] = path
    return found


def prlimit_args(prlimit: str, limits: Limits) -> list[str]:
    return [
        prlimit,
        f"--nproc={limits.max_processes}:{limits.max_processes}",
        f"--as={limits.memory_bytes}:{limits.memory_bytes}",
        "--",
    ]


def _resolv_conf_bind(spec: SandboxSpec) -> list[str]:
    if spec.resolv_conf is None:
        return []
    return ["--ro-bind", str(spec.resolv_conf), "/etc/resolv.conf"]


def _scratch_mounts(spec: SandboxSpec) -> list[str]:
    """Every writable tmpfs but the home, each of a bounded size: /tmp and /dev/shm of
    ``tmp_bytes``, /run (hiding the host's sockets there) of RUN_BYTES; /dev itself is
    read-only (its device nodes stay usable: they are bind mounts of their own)."""
    run = ["--size", str(RUN_BYTES), "--tmpfs", "/run"] if (spec.root / "run").is_dir() else []
    return [
        "--dev",
        "/dev",
        "--size",
        str(spec.limits.tmp_bytes),
        "--tmpfs",
        "/dev/shm",
        "--remount-ro",
        "/dev",
        *run,
        "--size",
        str(spec.limits.tmp_bytes),
        "--tmpfs",
        "/tmp",
    ]


def passwd_paths(spec: SandboxSpec) -> tuple[Path, Path]:
    """The sandbox's /etc/passwd and /etc/group on the host, next to its home."""
    return (
        spec.home.parent / f"{spec.home.name}.passwd",
        spec.home.parent / f"{spec.home.name}.group",
    )


def hosts_path(spec: SandboxSpec) -> Path:
    """The sandbox's /etc/hosts on the host, next to its home."""
    return spec.home.parent / f"{spec.home.name}.hosts"


def hosts_text(spec: SandboxSpec) -> str:
    """The sandbox's own /etc/hosts: localhost, and its hostname at its own address
    (``127.0.1.1`` without one). A lookup of its own name (``socket.getfqdn()``, which
    ``python3 -m http.server`` makes before it listens) is answered from the file, with
    no DNS query: a sandbox without internet has no resolver to ask. Its address, not a
    loopback one, so that a server bound to its hostname is reached from outside."""
    own = spec.address or "127.0.1.1"
    return (
        f"127.0.0.1\tlocalhost\n{own}\t{spec.hostname}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    )


def _hosts_bind(spec: SandboxSpec) -> list[str]:
    """Bound over the root's /etc/hosts: a read-only root without one (nothing to bind
    onto) keeps its own."""
    target = spec.root / "etc" / "hosts"
    if target.is_symlink() or not target.is_file():
        return []
    return ["--ro-bind", str(hosts_path(spec)), "/etc/hosts"]


def prepare_home(spec: SandboxSpec) -> None:
    """Write the sandbox's passwd, group and hosts files next to where its host home would be
    (the home itself is a tmpfs inside the sandbox, see ``_home_mounts``).

    The directory must already exist and be traversable by the uid (e.g. 0711).
    """
    _check_home(spec)
    passwd, group = passwd_paths(spec)
    nobody = "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    _write_private(
        passwd,
        f"{SANDBOX_USER}:x:{spec.uid}:{spec.uid}::{SANDBOX_HOME}:/bin/sh\n{nobody}",
        spec.uid,
    )
    _write_private(group, f"{SANDBOX_USER}:x:{spec.uid}:\nnogroup:x:65534:\n", spec.uid)
    _write_private(hosts_path(spec), hosts_text(spec), spec.uid)


def make_home(spec: SandboxSpec) -> None:
    """Create the host home directory if missing: 0700, owned by the sandbox uid."""
    _check_home(spec)
    with contextlib.suppress(FileExistsError):
        spec.home.mkdir(mode=0o700)
    os.chown(spec.home, spec.uid, spec.uid)
    spec.home.chmod(0o700)


def _check_home(spec: SandboxSpec) -> None:
    if spec.uid <= 0:
        raise RuntimeFailure(f"sandbox {spec.id}: refusing uid {spec.uid} (must be > 0)")
    if not spec.home.is_absolute():
        raise RuntimeFailure(f"sandbox {spec.id}: home must be absolute, got {spec.home}")
    if not spec.home.parent.is_dir():
        raise RuntimeFailure(f"sandbox {spec.id}: {spec.home.parent} does not exist")
    if spec.home.is_symlink():
        raise RuntimeFailure(f"sandbox {spec.id}: home {spec.home} is a symlink")


def remove_home(spec: SandboxSpec) -> None:
    for path in (*passwd_paths(spec), hosts_path(spec)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    if spec.home.is_symlink():
        spec.home.unlink()
    elif spec.home.exists():
        shutil.rmtree(spec.home)  # fd-based: safe against symlinks the sandbox left


def _write_private(path: Path, text: str, gid: int) -> None:
    """Write a root-owned file readable by group ``gid`` only (0640), atomically."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o640)
    try:
        os.write(fd, text.encode())
        os.fchown(fd, 0, gid)
        os.fchmod(fd, 0o640)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class Launchers:
    """Launcher processes, by sandbox id, reaped so that none stays a zombie.

    One registry per agent process (``LAUNCHERS``), shared by every runtime object:
    the launchers are children of the process, not of a runtime, so a runtime made
    later in the same process (an agent restarted in-process) still reaps them, and a
    runtime that is dropped while its sandboxes run drops no Popen that still runs.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def add(self, sandbox_id: str, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._procs[sandbox_id] = proc

    def reap(self) -> None:
        """Collect every launcher that has exited (cheap; called from every verb)."""
        with self._lock:
            done = [sid for sid, proc in self._procs.items() if proc.poll() is not None]
            for sid in done:
                del self._procs[sid]

    def kill_children(self, sandbox_id: str) -> None:
        """SIGKILL the children of a sandbox's launcher: its init, whatever its pid."""
        with self._lock:
            proc = self._procs.get(sandbox_id)
        if proc is None or proc.poll() is not None:
            return
        for pid in procfs.all_pids():
            stat = procfs.read_stat(pid)
            if stat is not None and stat.ppid == proc.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def wait(self, sandbox_id: str, timeout: float) -> None:
        """Wait for the launcher of a sandbox whose init was killed; kill it if it lingers."""
        with self._lock:
            proc = self._procs.pop(sandbox_id, None)
        if proc is None:
            return
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def read_to_eof(fd: int, deadline: float) -> bytes:
    """Everything written to a pipe until its last writer closes it, or RuntimeFailure."""
    chunks: list[bytes] = []
    while True:
        chunk = read_some(fd, deadline)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def read_some(fd: int, deadline: float) -> bytes:
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        if poller.poll(left * 1000):
            return os.read(fd, 4096)


def read_available(fd: int, limit: int = 8192) -> str:
    """What a pipe holds right now, without waiting for writers to close it."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    try:
        return os.read(fd, limit).decode(errors="replace").strip()
    except BlockingIOError:
        return ""


def check_path(path: str) -> list[str]:
    """The components of an absolute sandbox path after resolving ``.`` and ``..``.

    Lexical only: symlinks inside the sandbox are not (and cannot safely be) resolved.
    """
    if not path.startswith("/") or "\0" in path:
        raise RuntimeFailure(f"not an absolute path: {path!r}")
    parts: list[str] = []
    for component in path.split("/"):
        if component in ("", "."):
            continue
        if component == "..":
            if not parts:
                raise RuntimeFailure(f"path escapes the sandbox root: {path!r}")
            parts.pop()
        else:
            parts.append(component)
    return parts


LAUNCHERS = Launchers()


class PinnedNamespaces:
    """An open file of each entered sandbox's pid namespace, by sandbox id: what an enter
    command compares ``/proc/PID/ns/pid`` with (``test -ef``), so that a recycled pid
    never leads into another process's namespaces. Opened on first use, once the pid is
    checked against the sandbox's identity; closed when the sandbox is destroyed, and
    any other whose sandbox is gone with it (an enter racing a destroy can pin anew)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, tuple[Identity, int]] = {}

    def path(self, sandbox_id: str, identity: Identity) -> str:
        """``/proc/AGENT/fd/N``: this process's open file of the sandbox's namespace."""
        with self._lock:
            pinned = self._open.get(sandbox_id)
            if pinned is None or pinned[0] != identity:
                if pinned is not None:
                    os.close(self._open.pop(sandbox_id)[1])
                pinned = self._open[sandbox_id] = (identity, _pin(sandbox_id, identity))
            return f"/proc/{os.getpid()}/fd/{pinned[1]}"

    def release(self, sandbox_id: str) -> None:
        with self._lock:
            gone = [
                sid
                for sid, (identity, _) in self._open.items()
                if sid == sandbox_id or not procfs.matches(identity)
            ]
            closing = [self._open.pop(sid)[1] for sid in gone]
        for fd in closing:
            os.close(fd)


def _pin(sandbox_id: str, identity: Identity) -> int:
    """An open file of the pid namespace of ``identity``'s init; RuntimeFailure once it is
    gone (or its pid is another process's)."""
    try:
        fd = os.open(f"/proc/{identity.pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        raise RuntimeFailure(f"sandbox {sandbox_id} is not running") from None
    if os.fstat(fd).st_ino != identity.pid_namespace or not procfs.matches(identity):
        os.close(fd)
        raise RuntimeFailure(f"sandbox {sandbox_id} is not running")
    return fd


class BubblewrapRuntime:
    """Sandboxes as bubblewrap user namespaces, one host uid each (see the module doc)."""

    name = "bubblewrap"
    isolated = True
    TOOLS = ("bwrap", "setpriv", "nsenter", "prlimit", "mount")

    def __init__(
        self,
        *,
        use_cgroups: bool | None = None,
        cgroups: Cgroups | None = None,
        start_timeout: float = START_TIMEOUT,
        stop_timeout: float = STOP_TIMEOUT,
    ) -> None:
        """``use_cgroups``: None detects (cgroups if usable, else rlimits), True
        requires them, False forces rlimits. ``cgroups`` picks the hierarchy root and
        parent directory (default /sys/fs/cgroup/<ctrl>/sandboxctl)."""
        self._tools = find_tools(self.TOOLS)
        self._cgroups = cgroups or Cgroups()
        if use_cgroups is False:
            self._use_cgroups = False
        else:
            self._use_cgroups = self._cgroups.available()
            if use_cgroups and not self._use_cgroups:
                raise RuntimeFailure(f"cgroups are unavailable: {self._cgroups.reason}")
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._launchers = LAUNCHERS
        self._namespaces = PinnedNamespaces()

    @property
    def limits_mode(self) -> str:
        """How limits are enforced here: "cgroup-v1" or "rlimit"."""
        return "cgroup-v1" if self._use_cgroups else "rlimit"

    def usage(self, spec: SandboxSpec) -> CgroupUsage | None:
        """What the sandbox's cgroups count; None in rlimit mode (the caller counts by
        uid) or when they are gone."""
        if not self._use_cgroups:
            return None
        try:
            return self._cgroups.usage(spec.id)
        except (OSError, ValueError):
            return None

    @property
    def freeze_mode(self) -> str:
        """How ``freeze`` stops a sandbox: "cgroup-v2", "cgroup-v1" or "signals"."""
        return self._cgroups.freezer if self._use_cgroups else "signals"

    @classmethod
    def check(cls) -> None:
        """Verify this host can run the runtime; RuntimeFailure says how to fix it."""
        if os.geteuid() != 0:
            raise RuntimeFailure(
                "the bubblewrap runtime must run as root: it starts each sandbox as its own uid"
            )
        tools = find_tools(cls.TOOLS)
        probe = [
            tools["setpriv"],
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            tools["bwrap"],
            "--unshare-user",
            "--ro-bind",
            "/",
            "/",
            "true",
        ]
        try:
            result = subprocess.run(
                probe,
                env=dict(HOST_ENV),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeFailure(f"bwrap does not run: {exc}") from exc
        if result.returncode != 0:
            why = (result.stderr.strip().splitlines() or ["no error output"])[-1]
            raise RuntimeFailure(
                f"unprivileged bwrap user namespaces do not work ({why}): allow them, "
                "e.g. sysctl -w user.max_user_namespaces=100000 "
                "kernel.unprivileged_userns_clone=1"
            )

    # --- the Runtime protocol ------------------------------------------------------------

    def launch_command(self, spec: SandboxSpec, info_fd: int) -> list[str]:
        """The host command line that starts the sandbox (run as root, see module doc)."""
        passwd, group = passwd_paths(spec)
        bwrap = [
            self._tools["bwrap"],
            "--unshare-user",
            "--disable-userns",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-net",
            "--unshare-cgroup-try",
            "--hostname",
            spec.hostname,
            "--ro-bind",
            str(spec.root),
            "/",
            "--proc",
            "/proc",
            *_scratch_mounts(spec),
            *self._home_mounts(spec),
            "--ro-bind",
            str(passwd),
            "/etc/passwd",
            "--ro-bind",
            str(group),
            "/etc/group",
            *_hosts_bind(spec),
            *_resolv_conf_bind(spec),
            "--chdir",
            SANDBOX_HOME,
            "--setenv",
            "HOME",
            SANDBOX_HOME,
            "--new-session",
            "--info-fd",
            str(info_fd),
            "--",
            "/bin/sh",
            "-c",
            ready_script(spec.limits),
        ]
        setpriv = [
            self._tools["setpriv"],
            f"--reuid={spec.uid}",
            f"--regid={spec.uid}",
            "--clear-groups",
            "--",
        ]
        if self._use_cgroups:
            return join_command(
                self._cgroups.procs_files(spec.id),
                [*setpriv, *bwrap],
                best_effort=self._cgroups.accounting_files(spec.id),
            )
        return [*prlimit_args(self._tools["prlimit"], spec.limits), *setpriv, *bwrap]

    def _home_mounts(self, spec: SandboxSpec) -> list[str]:
        """/home/user: a tmpfs of the size class's ``home_bytes``, the sandbox's own
        (0700), in an otherwise empty, read-only /home. It lives in the sandbox's mount
        namespace, so it goes with the sandbox; its pages count against its memory."""
        return [
            "--tmpfs",
            "/home",
            "--perms",
            "0700",
            "--size",
            str(spec.limits.home_bytes),
            "--tmpfs",
            SANDBOX_HOME,
            "--remount-ro",
            "/home",
        ]

    def start(self, spec: SandboxSpec) -> Identity:
        self._launchers.reap()
        self._check_root(spec)
        try:
            prepare_home(spec)
            if self._use_cgroups:
                self._cgroups.create(spec.id, spec.limits)
        except OSError as exc:
            self._cleanup_quietly(spec)
            raise RuntimeFailure(f"sandbox {spec.id}: cannot prepare: {exc}") from exc
        except RuntimeFailure:
            self._cleanup_quietly(spec)
            raise
        info_r, info_w = os.pipe()
        ready_r, ready_w = os.pipe()
        err_r, err_w = os.pipe()
        proc: subprocess.Popen[bytes] | None = None
        try:
            try:
                proc = subprocess.Popen(
                    self.launch_command(spec, info_w),
                    pass_fds=(info_w,),
                    start_new_session=True,
                    stdin=subprocess.DEVNULL,
                    stdout=ready_w,
                    stderr=err_w,
                    cwd="/",
                    env=dict(HOST_ENV),
                )
            finally:
                for fd in (info_w, ready_w, err_w):
                    os.close(fd)
            self._launchers.add(spec.id, proc)
            deadline = time.monotonic() + self._start_timeout
            info = read_to_eof(info_r, deadline)
            if not info:
                raise _StartError("bwrap failed before starting the sandbox")
            ready = read_some(ready_r, deadline)
            if ready != b"R":
                raise _StartError("the sandbox's init exited before it was ready")
            identity = self._identity_from(json.loads(info))
            self._limit_ptys(identity, deadline)
        except (_StartError, TimeoutError, OSError, ValueError, KeyError) as exc:
            why = "timed out" if isinstance(exc, TimeoutError) else str(exc)
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(0.5)  # a failing bwrap exits at once; let it write why
            detail = read_available(err_r)
            self._cleanup_quietly(spec)
            raise RuntimeFailure(
                f"sandbox {spec.id} did not start: {why}" + (f": {detail}" if detail else "")
            ) from exc
        except BaseException:  # a bug or an interrupt: still leave nothing behind
            self._cleanup_quietly(spec)
            raise
        finally:
            for fd in (info_r, ready_r, err_r):
                os.close(fd)
        return identity

    def alive(self, identity: Identity) -> bool:
        self._launchers.reap()
        return procfs.matches(identity)

    def freeze(self, spec: SandboxSpec, identity: Identity) -> None:
        self._launchers.reap()
        try:
            if self._use_cgroups:
                self._cgroups.freeze(spec.id, FREEZE_TIMEOUT)
                return
            self._require_alive(spec, identity)
            stop_namespace(identity.pid_namespace, FREEZE_TIMEOUT)
        except OSError as exc:
            raise RuntimeFailure(f"sandbox {spec.id}: cannot freeze: {exc}") from exc

    def thaw(self, spec: SandboxSpec, identity: Identity) -> None:
        self._launchers.reap()
        try:
            if self._use_cgroups:
                self._cgroups.thaw(spec.id)
                return
            self._require_alive(spec, identity)
            continue_namespace(identity.pid_namespace)
        except OSError as exc:
            raise RuntimeFailure(f"sandbox {spec.id}: cannot thaw: {exc}") from exc

    def destroy(self, spec: SandboxSpec, identity: Identity | None) -> None:
        """Kill the namespace's init (which kills the namespace), reap the launcher, kill
        and remove the cgroups, kill any process left with the uid, then remove the
        passwd/group files and the home directory."""
        try:
            if self._use_cgroups:
                self._cgroups.thaw(spec.id)
            elif identity is not None and procfs.matches(identity):
                continue_namespace(identity.pid_namespace)  # see continue_namespace
            # The init first, and let its parent (the launcher) reap it before the rest
            # dies: killed at once, the launcher would leave it to the host's init.
            if identity is not None:
                kill_init(identity, self._stop_timeout)
            else:
                self._launchers.kill_children(spec.id)
            self._launchers.wait(spec.id, self._stop_timeout)
            if self._use_cgroups:
                self._cgroups.remove(spec.id, self._stop_timeout)
            procfs.kill_uid(spec.uid, self._stop_timeout)
            remove_home(spec)
        except OSError as exc:
            raise RuntimeFailure(f"sandbox {spec.id}: cannot destroy: {exc}") from exc
        finally:
            self._namespaces.release(spec.id)
            self._launchers.reap()

    def enter(self, spec: SandboxSpec, identity: Identity, command: Command) -> Entry:
        """``command`` inside the sandbox: its cgroups, all its namespaces, its uid and gid
        (no supplementary groups, NoNewPrivs, no capabilities), its open-files limit.

        The host chain (``/bin/sh`` joining the cgroups, setpriv, nsenter) is fixed text
        with ``HOST_ENV``: the command reaches the sandbox as the entry's script
        (``entering``). nsenter forks the shim into the pid namespace and waits for it
        (exiting with its status, or by its signal), but does not forward signals: start
        it with ``start_new_session=True`` and signal it with ``signal_entered``. It
        refuses to run (exit 125) when, by the time it runs, the sandbox's init is gone
        or its pid is another process's (checked by pid namespace inode) or, with
        cgroups, the sandbox has been destroyed.
        """
        script = command_script(command, open_files=open_files(spec.limits))
        self._require_alive(spec, identity)
        pinned = self._namespaces.path(spec.id, identity)
        pid = identity.pid
        nsenter = [
            self._tools["nsenter"],
            "-t",
            str(pid),
            "-U",
            "-p",
            "-m",
            "-i",
            "-u",
            "-n",
            "-C",
            "-w",
            "-S",
            str(spec.uid),
            "-G",
            str(spec.uid),
            "--",
            *shim_argv(),
        ]
        # setpriv drops root's supplementary groups (nsenter cannot: setgroups is
        # denied inside the user namespace) and sets NoNewPrivs before nsenter runs.
        setpriv = [self._tools["setpriv"], "--clear-groups", "--no-new-privs", "--"]
        # The pid is the sandbox's init only while its pid namespace is the one pinned
        # (a shell builtin: no program to start for the check).
        guard = (
            f"[ /proc/{pid}/ns/pid -ef {pinned} ] || "
            f'{{ echo "sandboxctl: sandbox {spec.id} is not running" >&2; '
            f"exit {FAILED_TO_ENTER}; }}"
        )
        if self._use_cgroups:
            argv = join_command(
                self._cgroups.procs_files(spec.id),
                [*setpriv, *nsenter],
                guard=guard,
                best_effort=self._cgroups.accounting_files(spec.id),
            )
        else:
            limited = [*prlimit_args(self._tools["prlimit"], spec.limits), *setpriv, *nsenter]
            argv = join_command([], limited, guard=guard)
        return Entry(argv, HOST_ENV, script)

    @staticmethod
    def entered(identity: Identity, leader: int) -> tuple[int, int] | None:
        """(host pid, pid inside the sandbox) of the command ``enter`` started as
        ``leader`` (nsenter forks it into the sandbox's pid namespace; before that the
        leader's shell forks for its guard, outside); None until it is there, and once
        it has been reaped."""
        for child in procfs.children(leader):
            if procfs.pid_namespace(child) == identity.pid_namespace:
                inside = procfs.innermost_pid(child)
                return (child, inside) if inside is not None else None
        return None

    @staticmethod
    def signal_entered(pgid: int, sig: int) -> None:
        """Signal a command started from ``enter`` in a session of its own
        (``pgid`` is the pid the caller spawned): every process of its group except the
        group leader, nsenter, which exits by itself once its child has.

        ``os.killpg`` would work too, but killing nsenter together with its child
        leaves the child's zombie to the host's init, because nsenter is outside the
        sandbox's pid namespace; the namespace's init then waits for it on destroy.
        """
        for pid in procfs.all_pids():
            stat = procfs.read_stat(pid)
            if pid != pgid and stat is not None and stat.pgrp == pgid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)

    def host_path(self, spec: SandboxSpec, identity: Identity, path: str) -> Path:
        """``/proc/PID/root`` + ``path``, with ``.`` and ``..`` resolved lexically; a path
        that climbs above / raises RuntimeFailure.

        Use the result only with the sandbox uid's credentials (a process or fsuid of
        ``spec.uid``), never as root: symlinks inside the sandbox are followed by the
        kernel, and an absolute symlink resolves against the *host* root when reached
        through /proc/PID/root, so root following one could touch any host file. (Root
        also cannot create files in the sandbox's /tmp: the tmpfs belongs to the
        sandbox's user namespace, where uid 0 is unmapped, and the kernel answers
        EOVERFLOW.) The path is valid while the sandbox runs; it is checked once here.
        """
        parts = check_path(path)
        self._require_alive(spec, identity)
        return Path(f"/proc/{identity.pid}/root").joinpath(*parts)

    # --- internals -----------------------------------------------------------------------

    def _check_root(self, spec: SandboxSpec) -> None:
        if not spec.root.is_absolute() or not spec.root.is_dir():
            raise RuntimeFailure(f"sandbox {spec.id}: root {spec.root} is not a directory")
        for inside in MOUNT_POINTS:
            if not os.path.lexists(spec.root / inside):
                raise RuntimeFailure(
                    f"sandbox {spec.id}: root {spec.root} lacks /{inside}, needed as a mount point"
                )

    def _limit_ptys(self, identity: Identity, deadline: float) -> None:
        """At most PTYS_PER_SANDBOX ptys in the sandbox's own devpts instance. bwrap
        mounts it with the kernel's maximum, so one sandbox could take every pty the
        host leaves to other instances, and the next sandbox would have none. Set from
        the host, before anything of a tenant runs, with the host's own mount tool
        (never a program of the sandbox's root) acting in the sandbox's mount namespace."""
        options = f"remount,nosuid,noexec,mode=620,ptmxmode=666,max={PTYS_PER_SANDBOX}"
        # Source and type named, no helpers (-i), no mtab (-n): nothing of the sandbox's
        # root (its fstab, a mount.devpts) is read.
        mount = [self._tools["mount"], "-i", "-n", "-N", f"/proc/{identity.pid}/ns/mnt"]
        mount += ["-t", "devpts", "-o", options, "devpts", "/dev/pts"]
        try:
            done = subprocess.run(
                mount,
                env=dict(HOST_ENV),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=max(deadline - time.monotonic(), 0.1),
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise _StartError("limiting its ptys timed out") from None
        if done.returncode != 0:
            raise _StartError(f"cannot limit its ptys: {done.stderr.strip()}")

    def _identity_from(self, info: dict[str, object]) -> Identity:
        child = info["child-pid"]
        if not isinstance(child, int):
            raise ValueError(f"bwrap reported no child pid: {info}")
        identity = procfs.identity_of(child)
        if identity is None:
            raise _StartError(f"the sandbox's init {child} is gone")
        if identity.pid_namespace != info.get("pid-namespace", identity.pid_namespace):
            raise _StartError(f"process {child} is not in the sandbox's pid namespace")
        return identity

    def _require_alive(self, spec: SandboxSpec, identity: Identity) -> None:
        if not procfs.matches(identity):
            raise RuntimeFailure(f"sandbox {spec.id} is not running")

    def _cleanup_quietly(self, spec: SandboxSpec) -> None:
        """Undo a failed start; the start's own error is the one to report."""
        with contextlib.suppress(RuntimeFailure, OSError):
            self.destroy(spec, None)


class _StartError(Exception):
    pass


def stop_namespace(pid_namespace: int, timeout: float) -> None:
    """SIGSTOP every process of a pid namespace, including ones forked meanwhile, and
    return once all of them are stopped."""
    stop_all(lambda: procfs.pids_in_pid_namespace(pid_namespace), timeout)


def continue_namespace(pid_namespace: int) -> None:
    """SIGCONT every process of a pid namespace, and every stopped parent outside it.

    Those parents are nsenter processes of ``enter``: nsenter stops itself when
    its child stops, and is not in the namespace. Left stopped, it would never reap its
    child, and a killed namespace init waits for exactly that before it exits.
    """
    members = procfs.pids_in_pid_namespace(pid_namespace)
    procfs.signal_pids(members, signal.SIGCONT)
    parents = {stat.ppid for stat in map(procfs.read_stat, members) if stat is not None}
    for pid in parents.difference(members, {0}):
        stat = procfs.read_stat(pid)
        if stat is not None and stat.state in ("T", "t"):
            procfs.signal_pids([pid], signal.SIGCONT)


def stop_all(members: Callable[[], list[int]], timeout: float) -> None:
    """SIGSTOP every process ``members()`` lists until all of them are stopped, again
    for ones forked (or continued by a sibling) meanwhile."""

    def all_stopped() -> bool:
        running = []
        for pid in members():
            stat = procfs.read_stat(pid)
            if stat is not None and stat.state not in ("T", "t", "Z", "X"):
                running.append(pid)
        procfs.signal_pids(running, signal.SIGSTOP)
        return not running

    if not procfs.wait_until(timeout, all_stopped):
        raise RuntimeFailure(f"the sandbox's processes did not stop within {timeout:g}s")


def kill_init(identity: Identity, timeout: float) -> None:
    """SIGKILL a sandbox's init (the kernel then kills its whole pid namespace) and wait
    until its parent, the launcher, has reaped it. Not if the launcher is gone already
    (parent pid 1): then the host's init reaps it, whenever it does."""
    init = procfs.read_stat(identity.pid) if procfs.matches(identity) else None
    if init is None or not procfs.signal_identity(identity, signal.SIGKILL) or init.ppid == 1:
        return

    def reaped() -> bool:
        stat = procfs.read_stat(identity.pid)
        return stat is None or stat.start_time != identity.start_time

    procfs.wait_until(timeout, reaped)

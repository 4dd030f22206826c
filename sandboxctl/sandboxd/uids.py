"""Sandbox uids: one per sandbox, and host-wide claims so that agents on one host never
share a uid.

Destroying a sandbox SIGKILLs every process of its uid, so two agents (two ``serve``
fleets from two checkouts, say, both from the default ``--uid-base``) that gave the same
uid to a sandbox each would kill each other's sandboxes. Every agent whose runtime dir is
under one runtime root shares that root's ``uids`` directory: a claim is a symlink named
by the uid, pointing at the runtime dir of the agent that holds it. An agent claims a uid
before it starts a sandbox with it and drops the claim once the sandbox is destroyed, so
a claim outlives a stopped (or killed) agent together with its sandboxes.

A uid is free for an agent when nobody claims it, or its claim points at a runtime dir
that no longer exists (that fleet is gone), and no process runs as it (a user, or a
sandbox of a fleet from before claims). Claims are taken under an exclusive lock on
``uids/.lock``, so two agents never take the same uid at once.

``SandboxUids`` picks the uid of each sandbox an agent starts, takes the claims of the
sandboxes it adopts, and frees the uids it claims for none.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from sandboxctl.sandboxd import procfs
from sandboxctl.sandboxd.runtime import RuntimeFailure

log = logging.getLogger("sandboxctl.sandboxd")

LOCK_FILE = ".lock"
ORPHAN_KILL_TIMEOUT = 10.0


class UidClaims:
    """The claims of one holder (a runtime dir) in a shared claims directory."""

    def __init__(self, directory: Path, holder: Path) -> None:
        self.directory = directory
        self.holder = holder
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the directory's lock (also taken by the runtime dir cleanup)."""
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def take(self, uid: int, running: bool = False) -> bool:
        """Claim ``uid`` for this holder; False when another agent or a process has it.
        ``running``: the processes running as ``uid`` are this holder's (a sandbox it
        adopts), so they do not stop the claim."""
        with self.locked():
            holder = self.holder_of(uid)
            if holder == self.holder:
                return True
            if holder is not None and (holder.is_dir() or not holder.is_absolute()):
                return False
            if not running and procfs.pids_of_uid(uid):
                return False
            claim = self.directory / str(uid)
            scratch = self.directory / f".{uid}.{os.getpid()}"
            scratch.unlink(missing_ok=True)
            scratch.symlink_to(self.holder)
            os.replace(scratch, claim)  # over a stale claim, at once
            return True

    def drop(self, uid: int) -> None:
        """Give ``uid`` back, if this holder holds it."""
        with self.locked():
            if self.holder_of(uid) == self.holder:
                (self.directory / str(uid)).unlink(missing_ok=True)

    def holder_of(self, uid: int) -> Path | None:
        """The runtime dir holding ``uid``, or None; an unreadable claim holds it for a
        holder no agent has (the relative path ``?``)."""
        try:
            return Path(os.readlink(self.directory / str(uid)))
        except FileNotFoundError:
            return None
        except OSError:  # not a symlink: nobody's to take
            return Path("?")

    def held(self, holder: Path | None = None) -> set[int]:
        """The uids ``holder`` (default: this one) holds."""
        wanted = holder or self.holder
        return {
            int(entry.name)
            for entry in self.directory.iterdir()
            if entry.name.isdigit() and self.holder_of(int(entry.name)) == wanted
        }

    def drop_for(self, holder: Path, uid: int) -> None:
        """Under :meth:`locked`: remove ``holder``'s claim on ``uid`` (a gone fleet's)."""
        if self.holder_of(uid) == holder:
            (self.directory / str(uid)).unlink(missing_ok=True)


class SandboxUids:
    """The host uids of one agent's sandboxes. Thread-safe. With ``claims`` None, uids
    are picked from ``base`` up without asking anyone."""

    def __init__(self, base: int, claims: UidClaims | None) -> None:
        self._base = base
        self._claims = claims
        self._lock = threading.Lock()
        self._in_use: set[int] = set()
        self._skipped: set[int] = set()  # taken by others when last tried (logged)

    def reserve(self) -> int:
        """The uid for a sandbox about to start: the lowest from ``base`` up that this
        agent does not use, that no process runs as and, with claims, that no other
        agent claims."""
        with self._lock:
            uid = self._base
            while uid in self._in_use or not self._free(uid):
                uid += 1
            self._in_use.add(uid)
            return uid

    def use(self, uid: int) -> None:
        """``uid`` is a sandbox's of this agent (started, or adopted)."""
        with self._lock:
            self._in_use.add(uid)

    def release(self, uid: int) -> None:
        """A uid no sandbox of this agent has any more (destroyed, or never started)."""
        if self._claims is not None:
            self._claims.drop(uid)
        with self._lock:
            self._in_use.discard(uid)

    def claim_adopted(self, sandbox_id: str, uid: int) -> None:
        if self._claims is not None and not self._claims.take(uid, running=True):
            log.warning(
                "adopted sandbox %s runs as uid %d, which another agent claims", sandbox_id, uid
            )

    def held_elsewhere(self, uid: int) -> bool:
        """Whether another agent, still there, claims ``uid``."""
        if self._claims is None:
            return False
        holder = self._claims.holder_of(uid)
        return holder is not None and holder != self._claims.holder and holder.is_dir()

    def free_orphans(self, keep: Iterable[int]) -> None:
        """Kill the processes of each uid this agent claims for no sandbox (neither in
        ``keep`` nor in use) and drop its claim; a uid whose processes survive keeps its
        claim, to be tried again at the next start."""
        if self._claims is None:
            return
        with self._lock:
            wanted = set(keep) | self._in_use
        for uid in self._claims.held() - wanted:
            try:
                procfs.kill_uid(uid, ORPHAN_KILL_TIMEOUT)
            except RuntimeFailure as error:
                log.warning("uid %d of no sandbox: %s", uid, error)
            else:
                self._claims.drop(uid)
                log.info("freed uid %d: claimed by this agent for no sandbox it knows", uid)

    def _free(self, uid: int) -> bool:
        """Under the lock: claim ``uid`` (with claims), or see that no process runs as
        it; a uid found taken is logged once and skipped."""
        claims = self._claims
        free = claims.take(uid) if claims is not None else not procfs.pids_of_uid(uid)
        if not free and uid not in self._skipped:
            self._skipped.add(uid)
            log.warning(
                "uid %d is taken (another agent claims it, or a process runs as it): skipping it",
                uid,
            )
        return free

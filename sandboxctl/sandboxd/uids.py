"""Host-wide claims on sandbox uids, so that agents on one host never share a uid.

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
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from sandboxctl.sandboxd import procfs

LOCK_FILE = ".lock"


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

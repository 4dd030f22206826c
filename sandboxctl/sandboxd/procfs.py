"""Reading /proc: who a process is, and which processes belong to a sandbox.

Every function tolerates processes that vanish while they are read: a process that is
gone is simply not reported.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from sandboxctl.sandboxd.runtime import Identity, RuntimeFailure

PROC = Path("/proc")
POLL_INTERVAL = 0.005


@dataclass(frozen=True, slots=True)
class ProcStat:
    state: str  # R, S, D, T, t, Z, X, ...
    ppid: int
    pgrp: int
    start_time: int  # clock ticks since boot (field 22)


def read_stat(pid: int) -> ProcStat | None:
    """Fields of /proc/PID/stat, or None if there is no such process."""
    try:
        raw = (PROC / str(pid) / "stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = raw[raw.rindex(b")") + 2 :].split()
    return ProcStat(
        state=fields[0].decode(),
        ppid=int(fields[1]),
        pgrp=int(fields[2]),
        start_time=int(fields[19]),
    )


@dataclass(frozen=True, slots=True)
class ProcStatus:
    state: str  # as in ProcStat
    uid: int  # real
    euid: int  # effective
    innermost_pid: int | None  # the last NSpid field: the pid its own namespace gives it


def read_status(pid: int) -> ProcStatus | None:
    """Fields of /proc/PID/status, or None if there is no such process."""
    try:
        text = (PROC / str(pid) / "status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    state, ids, innermost = "", [-1, -1], None
    for line in text.splitlines():
        if line.startswith("State:"):
            state = line.split()[1]
        elif line.startswith("Uid:"):
            ids = [int(x) for x in line.split()[1:3]]
        elif line.startswith("NSpid:"):
            innermost = int(line.split()[-1])
            break  # after State and Uid; kernels without it read to the end
    return ProcStatus(state=state, uid=ids[0], euid=ids[1], innermost_pid=innermost)


def uid_of(pid: int) -> int | None:
    """The real uid of ``pid``, or None when it is gone."""
    status = read_status(pid)
    return None if status is None else status.uid


def pid_namespace(pid: int) -> int | None:
    """The inode of the pid namespace of ``pid`` (needs ptrace access: root)."""
    try:
        return os.stat(PROC / str(pid) / "ns" / "pid").st_ino
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None  # gone, or a process even root may not inspect (e.g. some inits)


def identity_of(pid: int) -> Identity | None:
    stat = read_stat(pid)
    ns = pid_namespace(pid)
    if stat is None or ns is None:
        return None
    return Identity(pid=pid, start_time=stat.start_time, pid_namespace=ns)


def matches(identity: Identity) -> bool:
    """True iff ``identity.pid`` is still that very process, alive (not a zombie)."""
    stat = read_stat(identity.pid)
    if stat is None or stat.state in ("Z", "X") or stat.start_time != identity.start_time:
        return False
    return pid_namespace(identity.pid) == identity.pid_namespace


def children(pid: int) -> list[int]:
    """The children of ``pid``'s main thread (zombies included until reaped)."""
    try:
        text = (PROC / str(pid) / "task" / str(pid) / "children").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return []
    return [int(child) for child in text.split()]


def innermost_pid(pid: int) -> int | None:
    """``pid`` as its own pid namespace numbers it (the last ``NSpid`` field)."""
    status = read_status(pid)
    return None if status is None else status.innermost_pid


def all_pids() -> list[int]:
    return [int(name) for name in os.listdir(PROC) if name.isdigit()]


def pids_in_pid_namespace(inode: int) -> list[int]:
    """Host pids of every live process whose pid namespace is ``inode``."""
    found = []
    for pid in all_pids():
        if pid_namespace(pid) == inode:
            stat = read_stat(pid)
            if stat is not None and stat.state not in ("Z", "X"):
                found.append(pid)
    return found


def pids_of_uid(uid: int) -> list[int]:
    """Host pids of every live process with ``uid`` as its real or effective uid."""
    return list(pids_of_uids(range(uid, uid + 1)))


def pids_of_uids(uids: range) -> dict[int, int]:
    """pid -> uid of every live process whose real or effective uid is in ``uids`` (one
    pass over /proc, however many uids)."""
    found = {}
    for pid in all_pids():
        status = read_status(pid)
        if status is None or status.state in ("Z", "X"):
            continue
        inside = [uid for uid in (status.uid, status.euid) if uid in uids]
        if inside:
            found[pid] = inside[0]
    return found


def signal_identity(identity: Identity, sig: int) -> bool:
    """Send ``sig`` to exactly this process, never to a process that recycled its pid.
    False when the process is gone or is not ``identity`` any more."""
    return signal_pinned(identity.pid, lambda _: matches(identity), sig)


def signal_pinned(pid: int, check: Callable[[int], bool], sig: int) -> bool:
    """Send ``sig`` to ``pid`` only if ``check(pid)`` holds while a pidfd pins the
    process: whatever ``check`` read of ``pid`` in /proc is still true of the process
    signalled, which cannot have exited and left its pid to another meanwhile. False
    when the process is gone or ``check`` refuses it."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        if not check(pid):
            return False
        signal.pidfd_send_signal(pidfd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(pidfd)


def signal_pids(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def wait_until(timeout: float, predicate: Callable[[], bool]) -> bool:
    """Poll ``predicate`` every few milliseconds until it holds or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_INTERVAL)


def kill_uid(uid: int, timeout: float) -> None:
    """SIGKILL every process of ``uid`` until none is left (uids are per sandbox)."""

    def none_left() -> bool:
        left = pids_of_uid(uid)
        signal_pids(left, signal.SIGKILL)
        return not left

    if not wait_until(timeout, none_left):
        raise RuntimeFailure(f"processes of uid {uid} survived SIGKILL for {timeout:g}s")

"""procfs on real processes: who a process is (its uid, its pid inside its namespace), and
a signal sent only while a pidfd pins the process its check approved."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator

import pytest

from sandboxctl.sandboxd import procfs

NOBODY = 65534


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "600"], user=NOBODY, start_new_session=True)
    yield process
    process.kill()
    process.wait()


def _gone_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_uid_of_and_read_status_name_a_process_and_none_once_it_is_gone(
    sleeper: subprocess.Popen[bytes],
) -> None:
    assert procfs.uid_of(os.getpid()) == os.getuid()
    assert procfs.uid_of(sleeper.pid) == NOBODY
    status = procfs.read_status(sleeper.pid)
    assert status is not None
    assert (status.uid, status.euid, status.innermost_pid) == (NOBODY, NOBODY, sleeper.pid)
    assert status.state in ("S", "R")
    assert procfs.innermost_pid(sleeper.pid) == sleeper.pid  # the host's own namespace
    assert procfs.pids_of_uids(range(NOBODY, NOBODY + 1)).get(sleeper.pid) == NOBODY

    gone = _gone_pid()
    assert procfs.uid_of(gone) is None
    assert procfs.read_status(gone) is None


def test_signal_pinned_signals_only_what_its_check_approves(
    sleeper: subprocess.Popen[bytes],
) -> None:
    checked: list[int] = []

    def refuse(pid: int) -> bool:
        checked.append(pid)
        return False

    assert procfs.signal_pinned(sleeper.pid, refuse, signal.SIGKILL) is False
    assert checked == [sleeper.pid]
    assert sleeper.poll() is None

    approve = lambda pid: procfs.uid_of(pid) == NOBODY  # noqa: E731
    assert procfs.signal_pinned(sleeper.pid, approve, signal.SIGKILL) is True
    assert sleeper.wait(timeout=20) == -signal.SIGKILL


def test_signal_pinned_on_a_gone_pid_checks_and_signals_nothing() -> None:
    gone = _gone_pid()
    assert procfs.signal_pinned(gone, lambda _: pytest.fail("checked"), signal.SIGKILL) is False


def test_signal_identity_spares_a_process_that_is_not_the_identity(
    sleeper: subprocess.Popen[bytes],
) -> None:
    identity = procfs.identity_of(sleeper.pid)
    assert identity is not None
    recycled = type(identity)(identity.pid, identity.start_time + 1, identity.pid_namespace)

    assert procfs.signal_identity(recycled, signal.SIGKILL) is False
    assert sleeper.poll() is None
    assert procfs.signal_identity(identity, signal.SIGKILL) is True
    assert sleeper.wait(timeout=20) == -signal.SIGKILL

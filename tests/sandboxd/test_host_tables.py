"""A sandbox cannot empty a host-wide kernel table for the others: open files, AIO
events, ptys (in the sandbox and envd's terminals for it). Attacked from inside real
sandboxes, as a tenant's code would; the host and a neighbour must still get their own."""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxctl.agentapi import ClaimRequest
from sandboxctl.envd.host import Command
from sandboxctl.sandboxd import entering, hostlimits
from sandboxctl.sandboxd.agent import Agent
from sandboxctl.sandboxd.state import SandboxRecord

# Fork as many processes as the sandbox allows; each opens /dev/null until refused and
# reports how many and why; then all of them hold what they opened.
OPEN_ALL = r"""
import os, sys, time
results = []
for _ in range(int(sys.argv[1])):
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        n = 0
        try:
            while True:
                os.open("/dev/null", os.O_RDONLY)
                n += 1
        except OSError as e:
            os.write(w, b"%d %d\n" % (n, e.errno))
        time.sleep(120)
        os._exit(0)
    os.close(w)
    results.append(r)
counts = [os.read(r, 100).split() for r in results]
print(sum(int(n) for n, _ in counts), *sorted({int(e) for _, e in counts}), flush=True)
time.sleep(120)
"""

# io_setup until refused: how many contexts, and the errno that ended it.
AIO_ALL = r"""
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
taken = 0
while taken < int(sys.argv[1]):
    ctx = ctypes.c_ulong(0)
    if libc.syscall(206, 65536, ctypes.byref(ctx)) != 0:
        break
    taken += 1
print(taken, ctypes.get_errno(), flush=True)
time.sleep(120)
"""

PTYS_ALL = r"""
import os, time
fds = []
try:
    while len(fds) < 10000:
        fds.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
    print(len(fds), 0, flush=True)
except OSError as e:
    print(len(fds), e.errno, flush=True)
time.sleep(120)
"""


@pytest.fixture
def started(make_agent) -> Agent:  # type: ignore[no-untyped-def]
    """An agent started as serve-sandboxd starts it (its start sizes the host's tables)."""
    agent: Agent = make_agent(pools={})
    agent.start()
    return agent


@pytest.fixture
def holders() -> Iterator[list[subprocess.Popen[str]]]:
    running: list[subprocess.Popen[str]] = []
    yield running
    for process in running:
        os.killpg(process.pid, signal.SIGKILL)  # its group: what runs inside too
        process.communicate()


def _hold(
    agent: Agent, record: SandboxRecord, script: str, arg: str, holders: list[subprocess.Popen[str]]
) -> list[int]:
    """Run ``script`` in the sandbox; the numbers of its first line, while it holds on."""
    command = Command(["python3", "-c", script, arg])
    process = entering.popen(
        agent.runtime.enter(agent.spec(record), agent.identity(record), command),
        stdout=subprocess.PIPE,
        text=True,
    )
    holders.append(process)
    assert process.stdout is not None
    return [int(word) for word in process.stdout.readline().split()]


def _inside(agent: Agent, record: SandboxRecord, script: str) -> str:
    entry = agent.runtime.enter(
        agent.spec(record), agent.identity(record), Command(["python3", "-c", script])
    )
    done = entering.run(entry, timeout=60, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _as_nobody(script: str) -> subprocess.CompletedProcess[str]:
    """A host process of an ordinary user (root could pass the file table's limit)."""
    argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    return subprocess.run(
        [*argv, sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )


def test_a_sandbox_that_opens_every_file_it_may_leaves_the_host_its_reserve(
    started: Agent, holders: list[subprocess.Popen[str]]
) -> None:
    greedy, neighbour = (started.claim(ClaimRequest("base")) for _ in range(2))
    limits = started.spec(greedy).limits
    total, *errnos = _hold(started, greedy, OPEN_ALL, str(limits.max_processes), holders)
    # Each process ran into its own limit (EMFILE), never the host's table (ENFILE).
    assert errnos == [errno.EMFILE], errnos
    assert total >= limits.open_files  # it did hold files: at least one process's worth
    allocated, _, most = (int(n) for n in Path("/proc/sys/fs/file-nr").read_text().split())
    assert most - allocated >= hostlimits.tables()[0].reserve
    opened = _as_nobody("import os\nfor _ in range(1000): os.open('/dev/null', os.O_RDONLY)")
    assert opened.returncode == 0, opened.stderr
    assert _inside(started, neighbour, "print('served')") == "served\n"


def test_a_sandbox_that_takes_every_aio_context_it_can_leaves_aio_to_the_others(
    started: Agent, holders: list[subprocess.Popen[str]]
) -> None:
    greedy, neighbour = (started.claim(ClaimRequest("base")) for _ in range(2))
    taken, why = _hold(started, greedy, AIO_ALL, "64", holders)
    assert (taken, why) == (64, 0)  # 8 million events: all of the kernel's default, twice
    one = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nctx = ctypes.c_ulong(0)\n"
    one += "assert libc.syscall(206, 128, ctypes.byref(ctx)) == 0, ctypes.get_errno()\n"
    assert _inside(started, neighbour, one + "print('aio')") == "aio\n"
    host = _as_nobody(one)
    assert host.returncode == 0, host.stderr


def test_a_sandbox_has_at_most_its_share_of_ptys(
    started: Agent, holders: list[subprocess.Popen[str]]
) -> None:
    greedy, neighbour = (started.claim(ClaimRequest("base")) for _ in range(2))
    opened, why = _hold(started, greedy, PTYS_ALL, "", holders)
    assert (opened, why) == (hostlimits.PTYS_PER_SANDBOX, errno.ENOSPC)
    assert _inside(started, neighbour, "import os\nos.openpty()\nprint('pty')") == "pty\n"
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.posix_openpt(os.O_RDWR | os.O_NOCTTY) >= 0  # the host's own


def test_the_host_tables_are_raised_to_what_the_sandboxes_need_and_never_lowered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    big = hostlimits.Table("fs.file-max", 100, 10)
    small = hostlimits.Table("fs.aio-max-nr", 100, 10)
    capped = hostlimits.Table("kernel.pty.max", 100, 10, ceiling=150)
    absent = hostlimits.Table("net.netfilter.nf_conntrack_max", 100, 10)
    stuck = hostlimits.Table("kernel.pid_max", 1 << 20, 10)  # read-only: even root fails
    for table, value in ((big, "5000"), (small, "120"), (capped, "10")):
        table.path(tmp_path).parent.mkdir(parents=True, exist_ok=True)
        table.path(tmp_path).write_text(value + "\n")
    stuck.path(tmp_path).symlink_to("/proc/sys/kernel/ngroups_max")
    raised = hostlimits.raise_tables(10, [big, small, capped, absent, stuck], root=tmp_path)
    assert raised == {"fs.aio-max-nr": 200, "kernel.pty.max": 150}
    assert big.path(tmp_path).read_text().strip() == "5000"  # never lowered
    assert small.path(tmp_path).read_text() == "200"
    assert f"sysctl -w kernel.pid_max={(1 << 20) + 100}" in caplog.text

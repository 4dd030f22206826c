"""A sandbox that writes without end to a client that does not read: the writer inside
is held (its pipe fills), the agent does not grow, and a neighbour is served."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sandboxctl.sandboxd import procfs
from tests.envd.conftest import Host
from tests.sandboxd.servers import wait_until

MiB = 1 << 20


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _written(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar")


def _held(pid: int) -> Callable[[], int | None]:
    """A check: what ``pid`` has written, once it writes no more (two polls agree)."""
    readings: list[int] = []

    def check() -> int | None:
        readings.append(_written(pid))
        return readings[-1] if readings[-2:-1] == readings[-1:] else None

    return check


def test_output_nobody_reads_holds_the_writer_and_not_the_agent(host: Host) -> None:
    envd, neighbour = host.claim(), host.claim()
    try:
        uid = int(envd.run("id -u")["stdout"])
        rss_before = _rss()
        start = {"process": {"cmd": "/usr/bin/yes", "args": ["y" * 4000]}}
        with envd.opened("process.Process/Start", start) as stream:
            stream.next()  # the start event: then this client reads nothing more

            def writer() -> int | None:
                found = [p for p in procfs.pids_of_uid(uid) if _comm(p) == "yes"]
                return found[0] if found else None

            pid = wait_until(writer, what="yes to run")
            written = wait_until(_held(pid), timeout=30, interval=0.2, what="yes to be held")
            # In flight: the pipe, one stream's outlet and the sockets' buffers.
            assert written < 64 * MiB
            assert _rss() - rss_before < 64 * MiB
            assert neighbour.run("echo served")["stdout"] == "served\n"
    finally:
        host.agent.release(envd.sandbox_id)
        host.agent.release(neighbour.sandbox_id)

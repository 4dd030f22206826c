from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sandboxctl.clock import ManualClock
from sandboxctl.core.model import PoolKey
from sandboxctl.sandboxd import procfs
from sandboxctl.sandboxd.agent import Agent, AgentSettings
from tests.sandboxd.servers import sandboxes_unavailable, wait_until

T0 = datetime(2026, 11, 30, 4, 0, tzinfo=UTC)
BASE = PoolKey("base")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Real sandboxes need root (uids, cgroups) and bubblewrap; say so instead of failing.
    reason = sandboxes_unavailable()
    if reason is None:
        return
    for item in items:
        if "tests/sandboxd" in str(item.fspath):
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def make_agent(state_dir: Path, uid_base: int, clock: ManualClock) -> Iterator:  # type: ignore[type-arg]
    """Agents without background loops: tests call refill_once() and reap() themselves."""
    from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime

    agents: list[Agent] = []

    def make(**overrides: object) -> Agent:
        settings = dict(
            node="n1",
            advertise_addr="127.0.0.1:7777",
            state_dir=state_dir,
            pools={BASE: 2},
            max_sandboxes=6,
            uid_base=uid_base,
        )
        settings.update(overrides)
        agent = Agent(AgentSettings(**settings), BubblewrapRuntime(), clock)  # type: ignore[arg-type]
        agents.append(agent)
        return agent

    yield make
    for agent in agents:
        agent.stop(destroy=True)


@pytest.fixture
def agent(make_agent) -> Agent:  # type: ignore[no-untyped-def]
    return make_agent()  # type: ignore[no-any-return]


@pytest.fixture
def as_uid() -> Iterator[Callable[[int], subprocess.Popen[bytes]]]:
    """Start a process running as a uid (what a sandbox left running looks like, or
    someone else's process); returns once it runs as that uid."""
    started: list[subprocess.Popen[bytes]] = []

    def start(uid: int) -> subprocess.Popen[bytes]:
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "60"]
        process = subprocess.Popen(argv)
        started.append(process)
        wait_until(lambda: procfs.pids_of_uid(uid), what=f"a process of uid {uid}")
        return process

    yield start
    for process in started:
        process.kill()
        process.wait()

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandboxctl.core.model import PoolKey
from sandboxctl.sandboxd.agent import Agent, AgentSettings
from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime
from sandboxctl.sandboxd.hostlimits import CONNECTIONS_PER_SANDBOX
from sandboxctl.sandboxd.network.sandboxes import SandboxNetwork
from tests.sandboxd.servers import sandboxes_unavailable


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    reason = sandboxes_unavailable() or (
        None if shutil.which("nft") and shutil.which("ip") else "nftables and iproute2 needed"
    )
    if reason is None:
        return
    for item in items:
        if "tests/sandboxd/network" in str(item.fspath):
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def network_agent(state_dir: Path, uid_base: int) -> Iterator[Callable[..., Agent]]:
    """Agents with a sandbox network (an auto subnet of their own, no DNS unless
    ``dns=(ip, port)``); stopped with their sandboxes destroyed unless a test stopped
    them itself."""
    agents: list[Agent] = []
    runtime_dir = Path(tempfile.mkdtemp(prefix="sandboxctl-net-", dir="/tmp"))
    runtime_dir.chmod(0o711)
    key = runtime_dir.name.removeprefix("sandboxctl-net-")[:16]

    def make(
        pools: dict[PoolKey, int] | None = None,
        dns: tuple[str, int] | None = None,
        connections: int = CONNECTIONS_PER_SANDBOX,
    ) -> Agent:
        network = SandboxNetwork(f"t{key}", "auto", dns, runtime_dir, connections)
        settings = AgentSettings(
            node="n1",
            advertise_addr="127.0.0.1:7777",
            state_dir=state_dir,
            pools=pools if pools is not None else {PoolKey("base"): 1},
            max_sandboxes=6,
            uid_base=uid_base,
        )
        agent = Agent(settings, BubblewrapRuntime(), network=network)
        agents.append(agent)
        return agent

    yield make
    for agent in agents:
        agent.stop(destroy=True)
    shutil.rmtree(runtime_dir, ignore_errors=True)

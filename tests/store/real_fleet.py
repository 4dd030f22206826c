"""Real host agents (bubblewrap) on loopback, the mesh inventory over them and a store
with node access: the fleet the end-to-end tests stand the APIs on."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.model import PoolKey
from sandboxctl.inventory.mesh import MeshInventorySource
from sandboxctl.sandboxd.agent import Agent, AgentSettings
from sandboxctl.sandboxd.api import create_app
from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime
from sandboxctl.sandboxd.network.sandboxes import SandboxNetwork
from sandboxctl.store import Query, SandboxStore
from sandboxctl.store.nodes import NodeAccess
from tests.apiserver.helpers import serving
from tests.sandboxd.servers import free_port, start_agent, wait_until


@dataclass
class RealFleet:
    agents: dict[str, Agent]
    store: SandboxStore
    pools: Mapping[PoolKey, int] = field(default_factory=dict)

    def filled(self) -> bool:
        """Whether the store lists every node's warm pools full."""
        return all(
            sum(c.warm for c in self.store.warm_candidates(key)) >= count * len(self.agents)
            for key, count in self.pools.items()
        )

    def reset(self) -> None:
        """Back to how ``real_fleet`` returned it, for the next test that shares it:
        every claimed sandbox released, the store listing none, every warm pool full."""
        for agent in self.agents.values():
            for record in agent.sandboxes():
                agent.release(record.id)
        wait_until(
            lambda: not self.store.list(Query.parse(None)).items and self.filled(),
            timeout=60,
            what="no sandbox listed and every warm pool full again",
        )


def real_fleet(
    stack: ExitStack,
    *,
    nodes: Sequence[str],
    pools: Mapping[PoolKey, int],
    uid_base: int,
    uid_step: int,
    max_sandboxes: int,
    token: str,
    prefix: str,
    poll: timedelta = timedelta(seconds=0.2),
    network: bool = False,
) -> RealFleet:
    """One agent per node (uids from ``uid_base``, ``uid_step`` apart per node), each
    served on a free port, and a store over them; all stopped by ``stack``. Returns once
    the store lists every node's warm pools full."""
    agents: dict[str, Agent] = {}
    addresses = []
    for offset, node in enumerate(nodes):
        state = Path(tempfile.mkdtemp(prefix=f"{prefix}{node}-", dir="/tmp"))
        state.chmod(0o711)  # sandbox uids traverse it to their homes
        stack.callback(shutil.rmtree, state, ignore_errors=True)
        port = free_port()
        settings = AgentSettings(
            node=node,
            advertise_addr=f"127.0.0.1:{port}",
            state_dir=state,
            pools=dict(pools),
            uid_base=uid_base + uid_step * offset,
            max_sandboxes=max_sandboxes,
        )
        sandbox_network = None
        if network:  # an auto subnet of its own, no DNS
            key = hashlib.sha256(str(state).encode()).hexdigest()[:16]
            sandbox_network = SandboxNetwork(key, "auto", None, state)
        agent = Agent(settings, BubblewrapRuntime(), network=sandbox_network)
        stack.callback(agent.stop, destroy=True)  # after its server stopped
        start_agent(agent)
        stack.enter_context(serving(create_app(agent, token), port))
        agents[node] = agent
        addresses.append(settings.advertise_addr)
    source = MeshInventorySource(addresses, token, poll_interval=poll)
    source.start()
    stack.callback(source.stop)
    store = SandboxStore(source, FreshnessRule(), nodes=NodeAccess(token))
    stack.callback(store.close)
    fleet = RealFleet(agents, store, dict(pools))
    wait_until(fleet.filled, timeout=60, what="every node's warm pools to fill and list")
    return fleet

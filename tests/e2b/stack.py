"""A real stack on loopback for the e2b API: two host agents (bubblewrap sandboxes, a
root token) read by the mesh inventory source, the store with node access, and the e2b
app (two keys in two namespaces) beside the Kubernetes-style app."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from sandboxctl.apiserver import create_kube_app
from sandboxctl.apiserver.e2b import E2bConfig, create_e2b_app
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.model import PoolKey
from sandboxctl.inventory.mesh import MeshInventorySource
from sandboxctl.sandboxd.agent import Agent, AgentSettings
from sandboxctl.sandboxd.api import create_app
from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime
from sandboxctl.store import SandboxStore
from sandboxctl.store.nodes import NodeAccess
from tests.apiserver.helpers import serving
from tests.sandboxd.servers import free_port, sandboxes_unavailable, wait_until

TOKEN = "fleet-root-token"
KEY_A = "e2b_" + "a" * 40  # namespace default
KEY_B = "e2b_" + "b" * 40  # namespace team-b
SECRET = b"envd-secret-for-tests"
DOMAIN = "sandboxes.test"
BASE = PoolKey("base")
NODES = ("node-a", "node-b")
WARM = 4
# A uid block of its own per session (the shared uid_base fixture counts per test).
UID_BASE = 350_000 + (os.getpid() % 1000) * 60


@dataclass
class Stack:
    store: SandboxStore
    agents: dict[str, Agent]
    api_url: str
    kube_url: str
    config: E2bConfig

    def sdk(self, key: str = KEY_A) -> dict[str, str]:
        """The SDK's connection parameters (e2b-wire §1.4); no envd call is made."""
        return {"api_key": key, "api_url": self.api_url, "sandbox_url": "http://127.0.0.1:9"}

    def live_ids(self) -> set[str]:
        return {r.id for agent in self.agents.values() for r in agent.sandboxes(None)}


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    reason = sandboxes_unavailable()
    if reason:
        pytest.skip(reason)
    with ExitStack() as stack:
        agents: dict[str, Agent] = {}
        addresses = []
        for offset, node in enumerate(NODES):
            state = Path(tempfile.mkdtemp(prefix=f"sandboxctl-e2b-{node}-", dir="/tmp"))
            state.chmod(0o711)
            stack.callback(shutil.rmtree, state, ignore_errors=True)
            port = free_port()
            settings = AgentSettings(
                node=node,
                advertise_addr=f"127.0.0.1:{port}",
                state_dir=state,
                pools={BASE: WARM},
                uid_base=UID_BASE + 30 * offset,
                max_sandboxes=24,
            )
            agent = Agent(settings, BubblewrapRuntime())
            stack.callback(agent.stop, destroy=True)  # after its server stopped
            agent.start()
            stack.enter_context(serving(create_app(agent, TOKEN), port))
            agents[node] = agent
            addresses.append(settings.advertise_addr)
        source = MeshInventorySource(addresses, TOKEN, poll_interval=timedelta(seconds=0.2))
        source.start()
        stack.callback(source.stop)
        nodes = NodeAccess(TOKEN)
        stack.callback(nodes.close)
        store = SandboxStore(source, FreshnessRule(), nodes=nodes)
        wait_until(
            lambda: len(store.view().warm_candidates(BASE)) == len(NODES),
            what="warm sandboxes on every node",
        )
        config = E2bConfig(
            domain=DOMAIN,
            envd_secret=SECRET,
            api_keys={KEY_A: "default", KEY_B: "team-b"},
        )
        api_url = stack.enter_context(serving(create_e2b_app(store, config)))
        kube_url = stack.enter_context(serving(create_kube_app(store, watch_interval=0.2)))
        yield Stack(store, agents, api_url, kube_url, config)

"""A real stack on loopback for the e2b API: two host agents (bubblewrap sandboxes, a
root token) read by the mesh inventory source, the store with node access, and the e2b
app (two keys in two namespaces) beside the Kubernetes-style app."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import pytest

from sandboxctl.apiserver import create_kube_app
from sandboxctl.apiserver.e2b import E2bConfig, create_e2b_app
from sandboxctl.core.model import PoolKey
from sandboxctl.sandboxd.agent import Agent
from sandboxctl.store import SandboxStore
from tests.apiserver.helpers import KUBE_TOKENS, kube_tls, serving
from tests.conftest import process_slot
from tests.sandboxd.servers import sandboxes_unavailable
from tests.store.real_fleet import real_fleet

TOKEN = "fleet-root-token"
KEY_A = "e2b_" + "a" * 40  # namespace default
KEY_B = "e2b_" + "b" * 40  # namespace team-b
SECRET = b"envd-secret-for-tests"
DOMAIN = "sandboxes.test"
BASE = PoolKey("base")
NODES = ("node-a", "node-b")
WARM = 4
# A uid block of its own per session (the shared uid_base fixture counts per test).
UID_BASE = 2_300_000 + process_slot() * 60  # clear of the uid_base fixture's blocks


@dataclass
class Stack:
    store: SandboxStore
    agents: dict[str, Agent]
    api_url: str
    kube_url: str
    config: E2bConfig

    def sdk(self, key: str = KEY_A) -> dict[str, str]:
        """The SDK's connection parameters; no envd call is made."""
        return {"api_key": key, "api_url": self.api_url, "sandbox_url": "http://127.0.0.1:9"}

    def live_ids(self) -> set[str]:
        return {r.id for agent in self.agents.values() for r in agent.sandboxes(None)}


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    reason = sandboxes_unavailable()
    if reason:
        pytest.skip(reason)
    with ExitStack() as stack:
        fleet = real_fleet(
            stack,
            nodes=NODES,
            pools={BASE: WARM},
            uid_base=UID_BASE,
            uid_step=30,
            max_sandboxes=24,
            token=TOKEN,
            prefix="sandboxctl-e2b-",
        )
        store, agents = fleet.store, fleet.agents
        config = E2bConfig(
            domain=DOMAIN,
            envd_secret=SECRET,
            api_keys={KEY_A: "default", KEY_B: "team-b"},
        )
        api_url = stack.enter_context(serving(create_e2b_app(store, config)))
        kube_url = stack.enter_context(
            serving(create_kube_app(store, KUBE_TOKENS, watch_interval=0.2), tls=kube_tls())
        )
        yield Stack(store, agents, api_url, kube_url, config)

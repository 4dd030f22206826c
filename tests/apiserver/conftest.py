from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from sandboxctl.apiserver import create_kube_app
from sandboxctl.clock import ManualClock
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.model import Entry, NodeInventory, Pool, PoolKey
from sandboxctl.inventory.memory import MemoryInventorySource
from sandboxctl.store import SandboxStore
from tests.apiserver.helpers import AUTH, KUBE_TOKENS, serving
from tests.cli.conftest import run  # noqa: F401  (the in-process CLI fixture)
from tests.conftest import process_slot
from tests.sandboxd.servers import sandboxes_unavailable
from tests.store.real_fleet import RealFleet, real_fleet
from tests.testing.realkube import kube  # noqa: F401

T0 = datetime(2026, 11, 30, 4, 0, tzinfo=UTC)
AGENTS_TOKEN = "fleet-root-token"
AGENT_NODES = ("node-a", "node-b")
# A uid block of its own per test process: two nodes 10 apart, 8 sandboxes each.
AGENTS_UID_BASE = 2_200_000 + process_slot() * 20
GROUP_PATH = "/apis/agents.x-k8s.io/v1beta1"
SANDBOXES = f"{GROUP_PATH}/namespaces/default/sandboxes"
ALL_SANDBOXES = f"{GROUP_PATH}/sandboxes"
TABLE = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,"
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)


def entry(name: str, phase: str = "Running", template: str = "base", age: int = 60) -> Entry:
    return Entry(
        name=name,
        phase=phase,
        id=f"sb_{name.replace('/', '_')}",
        template=template,
        claim_ref=name,
        addr="10.0.0.9:49983",
        deadline=T0 + timedelta(minutes=5),
        claimed_at=T0 - timedelta(seconds=age),
    )


def inventory(node: str, *entries: Entry) -> NodeInventory:
    return NodeInventory(
        node=node,
        address=f"{node}.invalid:7777",
        pools=(Pool(PoolKey("base"), warm=1, target=1),),
        entries=entries,
    )


FLEET = (
    inventory("n1", entry("default/a1"), entry("default/a2", phase="Hibernated", age=310)),
    inventory("n2", entry("default/b1", template="python"), entry("team/t1")),
)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def source(clock: ManualClock) -> MemoryInventorySource:
    return MemoryInventorySource(FLEET, clock=clock)


@pytest.fixture
def store(source: MemoryInventorySource, clock: ManualClock) -> SandboxStore:
    # No node access: reads come from the inventories only, and claims answer 503.
    return SandboxStore(source, FreshnessRule(), clock=clock)


@pytest.fixture
def client(store: SandboxStore) -> Iterator[httpx.Client]:
    with (
        serving(create_kube_app(store, KUBE_TOKENS, watch_interval=0.02)) as url,
        httpx.Client(base_url=url, headers=AUTH, timeout=10) as http,
    ):
        yield http


@pytest.fixture(scope="session")
def shared_agents() -> Iterator[RealFleet]:
    """Two real host agents (bubblewrap sandboxes, warm pools of 3 "base") read by the
    mesh inventory, and a store with node access over them: what test_reads and
    test_kubectl stand the Sandbox API on, started once for both."""
    reason = sandboxes_unavailable()
    if reason:
        pytest.skip(reason)
    with ExitStack() as stack:
        yield real_fleet(
            stack,
            nodes=AGENT_NODES,
            pools={PoolKey("base"): 3},
            uid_base=AGENTS_UID_BASE,
            uid_step=10,
            max_sandboxes=8,
            token=AGENTS_TOKEN,
            prefix="sandboxctl-apiserver-",
        )


@pytest.fixture
def agents(shared_agents: RealFleet) -> Iterator[RealFleet]:
    """``shared_agents`` as a test of its own finds them: no sandbox claimed or listed,
    every warm pool full; put back so after the test (a test's own API server is its own,
    served per test)."""
    shared_agents.reset()
    yield shared_agents
    shared_agents.reset()

"""Claims and verbs routed to real host agents, with the requests each node received."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sandboxctl.agentapi import AgentClient, ClaimRequest
from sandboxctl.clock import ManualClock
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.ids import SandboxId
from sandboxctl.core.model import NodeInventory, Pool, PoolKey
from sandboxctl.core.placement import NoNodeCapacity
from sandboxctl.inventory.memory import MemoryInventorySource
from sandboxctl.sandboxd.agent import Agent, AgentSettings
from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime
from sandboxctl.store import NotFound, SandboxStore
from sandboxctl.store.nodes import NodeAccess
from tests.sandboxd.servers import serving

TOKEN = "fleet-root-token"
T0 = datetime(2026, 11, 30, 4, 0, tzinfo=UTC)
BY_ID = "/v1/sandboxes/{sandbox_id}"

pytestmark = pytest.mark.usefixtures("needs_sandboxes")


@pytest.fixture
def needs_sandboxes() -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap (make test installs it)")


@dataclass
class Node:
    name: str
    agent: Agent
    address: str

    def requests(self, route: str) -> float:
        with AgentClient(self.address, TOKEN) as client:
            text = client.metrics()
        pattern = (
            rf'sandboxd_requests_total\{{method="GET",route="{re.escape(route)}",'
            rf'status="\d+"\}} ([0-9.e+]+)'
        )
        return sum(float(value) for value in re.findall(pattern, text))


@pytest.fixture
def nodes(uid_base: int) -> Iterator[dict[str, Node]]:
    running: dict[str, Node] = {}
    stack = []
    try:
        for offset, name in enumerate(("a", "b")):
            state = Path(tempfile.mkdtemp(prefix=f"sandboxctl-store-{name}-", dir="/tmp"))
            state.chmod(0o711)
            settings = AgentSettings(
                node=name,
                advertise_addr="",
                state_dir=state,
                pools={PoolKey("base"): 1},
                uid_base=uid_base + 10 * offset,
                max_sandboxes=4,
            )
            agent = Agent(settings, BubblewrapRuntime(), ManualClock(T0))
            agent.refill_once()
            server = serving(agent, TOKEN)
            address = server.__enter__()
            stack.append((agent, server, state))
            running[name] = Node(name, agent, address)
        yield running
    finally:
        for agent, server, state in stack:
            server.__exit__(None, None, None)
            agent.stop(destroy=True)
            shutil.rmtree(state, ignore_errors=True)


def _inventory(
    node: Node, warm: int = 1, stamp: datetime = T0, capacity: int | None = None
) -> NodeInventory:
    return NodeInventory(
        node=node.name,
        address=node.address,
        pools=(Pool(PoolKey("base"), warm=warm, target=1),),
        published_at=stamp,
        capacity=capacity,
    )


MakeStore = Callable[..., tuple[SandboxStore, MemoryInventorySource]]


@pytest.fixture
def make_store(nodes: dict[str, Node]) -> Iterator[MakeStore]:
    stores: list[SandboxStore] = []

    def make(
        clock: ManualClock | None = None, **warm: int
    ) -> tuple[SandboxStore, MemoryInventorySource]:
        clock = clock or ManualClock(T0)
        inventories = [_inventory(n, warm.get(name, 1)) for name, n in nodes.items()]
        source = MemoryInventorySource(inventories, clock=clock)
        store = SandboxStore(source, FreshnessRule(), clock=clock, nodes=NodeAccess(TOKEN))
        stores.append(store)
        return store, source

    yield make
    for store in stores:
        store.close()


def test_a_read_by_id_right_after_create_asks_only_the_owning_node(
    nodes: dict[str, Node], make_store: MakeStore
) -> None:
    store, _ = make_store()
    assignment = store.claim("default", "x", PoolKey("base"))
    other = nodes["b" if assignment.node == "a" else "a"]
    before = other.requests(BY_ID)

    located = store.locate_claim(SandboxId.of_claim(assignment.claim_id))

    assert located is not None
    assert located.node == assignment.node
    assert located.entry.name == "default/x"
    assert other.requests(BY_ID) == before == 0
    assert store.get("default", "x")["status"]["nodeName"] == assignment.node


def test_a_claims_owner_is_unlisted_until_its_nodes_inventory_lists_it(
    nodes: dict[str, Node], make_store: MakeStore
) -> None:
    store, source = make_store()
    assignment = store.claim("default", "x", PoolKey("base"))
    sandbox_id = SandboxId.of_claim(assignment.claim_id)
    # This server's pending write shows it, but no inventory lists it yet.
    remembered = store.resolver.owners.get(sandbox_id)
    assert remembered is not None
    assert not remembered.listed
    owner = store.owner(sandbox_id)  # asks the node for its row (the token)
    assert owner is not None
    assert owner.token
    assert not owner.listed

    published = _inventory(nodes[assignment.node])
    source.apply(replace(published, entries=(assignment.located.entry,)))
    store.sync()
    remembered = store.resolver.owners.get(sandbox_id)
    assert remembered is not None
    assert remembered.listed


def test_claims_never_sample_a_node_without_warm_capacity(
    nodes: dict[str, Node], make_store: MakeStore
) -> None:
    store, _ = make_store(a=0, b=1)
    for i in range(3):
        assert store.claim("default", f"c{i}", PoolKey("base")).node == "b"
        nodes["b"].agent.refill_once()


def test_with_no_warm_sandbox_anywhere_a_claim_starts_cold_on_the_roomiest_node(
    nodes: dict[str, Node], make_store: MakeStore
) -> None:
    store, source = make_store(a=0, b=0)
    source.apply(_inventory(nodes["a"], warm=0, capacity=2))
    source.apply(_inventory(nodes["b"], warm=0, capacity=4))
    placed = [store.claim("default", f"c{i}", PoolKey("base")).node for i in range(4)]
    # b has the most room until this server's own claims fill it down to a's
    assert placed == ["b", "b", "a", "b"]
    nodes["a"].agent.set_pools({})
    nodes["b"].agent.set_pools({})
    assert nodes["a"].agent.info().claimed == 1
    assert nodes["b"].agent.info().claimed == 3


def test_every_node_full_is_no_node_capacity(nodes: dict[str, Node], make_store: MakeStore) -> None:
    store, source = make_store(a=0, b=0)
    for node in nodes.values():  # fill every slot behind the inventories' back
        for _ in range(node.agent.settings.max_sandboxes):
            node.agent.claim(ClaimRequest(template="base"))
    with pytest.raises(NoNodeCapacity) as refused:
        store.claim("default", "x", PoolKey("base"))
    assert sorted(refused.value.tried) == ["a", "b"]  # both asked, both said 429
    source.apply(_inventory(nodes["a"], warm=0, capacity=0))
    source.apply(_inventory(nodes["b"], warm=0, capacity=0))
    with pytest.raises(NoNodeCapacity) as known:
        store.claim("default", "y", PoolKey("base"))
    assert known.value.tried == ()  # full by the inventories: nobody is asked


def test_a_stale_node_is_never_sampled_nor_asked(
    nodes: dict[str, Node], make_store: MakeStore
) -> None:
    clock = ManualClock(T0)
    store, source = make_store(clock)
    clock.advance(91)
    source.apply(_inventory(nodes["a"], stamp=T0 + timedelta(seconds=91)))  # a is live
    b_before = nodes["b"].requests(BY_ID)

    for i in range(3):
        assert store.claim("default", f"c{i}", PoolKey("base")).node == "a"
        nodes["a"].agent.refill_once()
    assert store.locate_claim(SandboxId.of_claim("sb_unknown")) is None
    assert nodes["b"].requests(BY_ID) == b_before
    assert nodes["b"].requests("/v1/sandboxes") == 0


def test_release_is_idempotent_and_then_the_name_is_gone(
    nodes: dict[str, Node], make_store: MakeStore
) -> None:
    store, _ = make_store()
    store.claim("default", "x", PoolKey("base"))
    located = store.locate("default", "x")
    assert located is not None

    store.release(located)
    store.release(located)  # the node answers 404: already released counts as released

    with pytest.raises(NotFound):
        store.get("default", "x")


def test_verbs_route_to_the_owning_node(nodes: dict[str, Node], make_store: MakeStore) -> None:
    store, _ = make_store()
    assignment = store.claim("default", "x", PoolKey("base"), ttl_seconds=60)
    located = store.locate_claim(SandboxId.of_claim(assignment.claim_id))
    assert located is not None

    store.pause(located)
    assert store.row_of(located).hibernated is True
    store.resume(located)
    deadline = store.renew(located, 600)
    assert deadline is not None
    assert deadline > (assignment.deadline or "")
    owner = nodes[assignment.node].agent
    assert owner.get(assignment.claim_id).ttl_seconds == 600


def test_a_claims_env_reaches_the_owning_node(
    nodes: dict[str, Node], make_store: MakeStore
) -> None:
    store, _ = make_store()
    with_env = store.claim("default", "x", PoolKey("base"), env={"FOO": "bar"})
    nodes[with_env.node].agent.refill_once()
    without = store.claim("default", "y", PoolKey("base"))

    assert nodes[with_env.node].agent.get(with_env.claim_id).env == {"FOO": "bar"}
    assert nodes[without.node].agent.get(without.claim_id).env == {}

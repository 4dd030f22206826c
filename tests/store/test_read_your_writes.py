"""Read-your-writes: this server's writes are visible to its next read of any kind, before
the inventories show them, and end when the inventories catch up.

The agents here answer through httpx's MockTransport (the store's real client, a fake
network), so the inventories move only when a test publishes; the real-agent paths are
covered by tests/store/test_claims.py and the kubectl and SDK tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest

from sandboxctl.agentapi.client import AgentClient
from sandboxctl.clock import ManualClock
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.ids import SandboxId
from sandboxctl.core.model import Entry, PoolKey
from sandboxctl.inventory.memory import MemoryInventorySource
from sandboxctl.store import Query, SandboxStore
from sandboxctl.store.nodes import NodeAccess
from tests.store.inventories import T0, node

EVERYTHING = Query.parse(None)


class FakeAgent:
    """Just enough of an agent's HTTP API for claims and verbs; rows kept in a dict."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.rows: dict[str, dict[str, Any]] = {}
        self.count = 0

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "POST" and path == "/v1/claim":
            body = json.loads(request.content)
            self.count += 1
            claim_id = f"sb_{self.name}{self.count}"
            row = {
                "id": claim_id,
                "key": {"template": body["template"], "net": "none", "size": "small"},
                "deadline": "2026-11-30T05:00:00Z",
                "claimed_at": "2026-11-30T04:00:00Z",
                "hibernated": False,
                "claim_ref": body["claim_ref"],
                "metadata": body.get("metadata") or {},
            }
            self.rows[claim_id] = row
            grant = {"id": claim_id, "token": "t", "deadline": row["deadline"], "sandbox": row}
            return httpx.Response(200, json=grant)
        parts = path.strip("/").split("/")  # v1 sandboxes <id> [verb]
        row = self.rows.get(parts[2]) if len(parts) >= 3 else None
        if row is None:
            return httpx.Response(404, json={"error": "not found"})
        verb = parts[3] if len(parts) > 3 else ""
        if verb == "release":
            del self.rows[parts[2]]
            return httpx.Response(204)
        if verb == "renew":
            row["deadline"] = "2026-11-30T06:00:00Z"
            return httpx.Response(200, json={"deadline": row["deadline"]})
        if verb in ("hibernate", "wake"):
            row["hibernated"] = verb == "hibernate"
            return httpx.Response(204)
        return httpx.Response(200, json={**row, "token": "t"})

    def entries(self) -> list[Entry]:
        from sandboxctl.agentapi.mapping import entry_from_row
        from sandboxctl.agentapi.models import SandboxRow

        return [entry_from_row(SandboxRow.from_json(row)) for row in self.rows.values()]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def agent() -> FakeAgent:
    return FakeAgent("a")


@pytest.fixture
def fleet(clock: ManualClock, agent: FakeAgent) -> Iterator[tuple[SandboxStore, Any]]:
    source = MemoryInventorySource([node("a")], clock=clock)
    transport = httpx.MockTransport(agent.handle)
    nodes = NodeAccess(
        "token", client_factory=lambda a, t, s: AgentClient(a, t, timeout=s, transport=transport)
    )
    store = SandboxStore(source, FreshnessRule(), clock=clock, nodes=nodes)
    yield store, source
    store.close()


def _publish(source: MemoryInventorySource, agent: FakeAgent, clock: ManualClock) -> None:
    """The node's next publish, a second later: what its agent holds now."""
    clock.advance(1)
    source.apply(node("a", *agent.entries(), stamp=clock.now()))


def _names(store: SandboxStore) -> list[str]:
    return [o["metadata"]["name"] for o in store.list(EVERYTHING).items]


def test_a_create_is_listed_got_and_found_by_id_at_once(
    fleet: tuple[SandboxStore, Any], agent: FakeAgent
) -> None:
    store, _ = fleet
    granted = store.claim("default", "new", PoolKey("base"))
    assert _names(store) == ["new"]  # the inventory has not published it
    assert store.get("default", "new")["status"]["nodeName"] == "a"
    found = store.locate_claim(SandboxId.of_claim(granted.claim_id), ask_nodes=False)
    assert found is not None
    assert found.entry.name == "default/new"


def test_a_delete_is_gone_at_once(
    fleet: tuple[SandboxStore, Any], agent: FakeAgent, clock: ManualClock
) -> None:
    store, source = fleet
    granted = store.claim("default", "old", PoolKey("base"))
    _publish(source, agent, clock)
    located = store.locate("default", "old")
    assert located is not None
    store.release(located)
    assert _names(store) == []  # the inventory still lists it
    assert store.locate_claim(SandboxId.of_claim(granted.claim_id), ask_nodes=False) is None
    assert source.snapshot().record("a").by_id.get(granted.claim_id) is not None  # type: ignore[union-attr]


def test_a_watch_sees_a_sandbox_created_and_deleted_within_one_poll(
    fleet: tuple[SandboxStore, Any],
) -> None:
    store, _ = fleet
    watch = store.watch(EVERYTHING, store.list(EVERYTHING).version)
    watch.open()
    store.claim("default", "brief", PoolKey("base"))
    located = store.locate("default", "brief")
    assert located is not None
    store.release(located)
    assert [(e.type, e.object["metadata"]["name"]) for e in watch.poll()] == [
        ("ADDED", "brief"),
        ("DELETED", "brief"),
    ]


def test_a_pause_renew_and_resume_are_read_at_once(fleet: tuple[SandboxStore, Any]) -> None:
    store, _ = fleet
    store.claim("default", "s", PoolKey("base"))
    located = store.locate("default", "s")
    assert located is not None
    store.pause(located)
    labels = store.get("default", "s")["metadata"]["labels"]
    assert labels["sandbox.cocoonstack.io/phase"] == "Hibernated"
    store.renew(located, 3600)
    annotations = store.get("default", "s")["metadata"]["annotations"]
    assert annotations["sandbox.cocoonstack.io/deadline"] == "2026-11-30T06:00:00Z"
    store.resume(located)
    labels = store.get("default", "s")["metadata"]["labels"]
    assert labels["sandbox.cocoonstack.io/phase"] == "Running"


def test_a_publish_that_shows_the_write_ends_it_without_an_event(
    fleet: tuple[SandboxStore, Any], agent: FakeAgent, clock: ManualClock
) -> None:
    store, source = fleet
    store.claim("default", "kept", PoolKey("base"))
    watch = store.watch(EVERYTHING, store.list(EVERYTHING).version)
    watch.open()
    _publish(source, agent, clock)  # shows exactly the entry written
    assert watch.poll() == []
    agent.rows.clear()  # the agent lost it: the next publish is believed at once
    _publish(source, agent, clock)
    assert [e.type for e in watch.poll()] == ["DELETED"]


def test_two_publishes_without_the_write_end_it(
    fleet: tuple[SandboxStore, Any], clock: ManualClock
) -> None:
    store, source = fleet
    store.claim("default", "died", PoolKey("base"))
    for publishes, listed in ((1, ["died"]), (2, [])):  # the first may have been in flight
        clock.advance(1)
        source.apply(node("a", stamp=clock.now()))
        assert _names(store) == listed, publishes


def test_a_publish_still_showing_a_released_sandbox_does_not_bring_it_back(
    fleet: tuple[SandboxStore, Any], agent: FakeAgent, clock: ManualClock
) -> None:
    store, source = fleet
    store.claim("default", "gone", PoolKey("base"))
    stale_view = list(agent.entries())
    located = store.locate("default", "gone")
    assert located is not None
    store.release(located)
    clock.advance(1)
    source.apply(node("a", *stale_view, stamp=clock.now()))  # read before the release
    assert _names(store) == []
    _publish(source, agent, clock)
    assert _names(store) == []


def test_a_write_the_node_never_republishes_ends_at_the_bound(
    fleet: tuple[SandboxStore, Any], clock: ManualClock
) -> None:
    store, _ = fleet
    store.claim("default", "quiet", PoolKey("base"))
    clock.advance(timedelta(seconds=89))
    assert _names(store) == ["quiet"]
    clock.advance(timedelta(seconds=2))  # past the freshness window (90 s)
    assert _names(store) == []

"""The store's rules on a static source: selectors, pinned reads, duplicates, staleness."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sandboxctl.clock import ManualClock
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.model import NodeInventory
from sandboxctl.inventory.memory import MemoryInventorySource
from sandboxctl.store import NotFound, Query, SandboxStore
from sandboxctl.store.watch import Watcher
from tests.store.inventories import T0, entry, node


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


def _store(clock: ManualClock, *nodes: NodeInventory) -> tuple[SandboxStore, MemoryInventorySource]:
    source = MemoryInventorySource(nodes, clock=clock)
    return SandboxStore(source, FreshnessRule(), clock=clock), source


def _names(objects: list[dict]) -> list[str]:  # type: ignore[type-arg]
    return [f"{o['metadata']['namespace']}/{o['metadata']['name']}" for o in objects]


def test_list_filters_by_namespace_and_labels_and_sorts(clock: ManualClock) -> None:
    store, _ = _store(
        clock,
        node("b", entry("default/z"), entry("team/a", "Hibernated")),
        node("a", entry("default/y"), entry("team/b")),
    )
    assert _names(store.list(Query.parse(None))) == ["default/y", "default/z", "team/a", "team/b"]
    assert _names(store.list(Query.parse("team"))) == ["team/a", "team/b"]
    running = Query.parse(None, labels="sandbox.cocoonstack.io/phase=Running")
    assert _names(store.list(running)) == ["default/y", "default/z", "team/b"]
    on_b = Query.parse(None, fields="status.nodeName=b")
    assert _names(store.list(on_b)) == ["default/z", "team/a"]


def test_an_unsupported_field_selector_names_the_field() -> None:
    with pytest.raises(InvalidValueError, match=r'field selector "spec.x" is not supported'):
        Query.parse("default", fields="spec.x=y")


def test_get_finds_a_sandbox_and_misses_are_not_found(clock: ManualClock) -> None:
    store, _ = _store(clock, node("a", entry("default/x")))
    obj = store.get("default", "x")
    assert obj["status"]["nodeName"] == "a"
    with pytest.raises(NotFound):
        store.get("default", "nope")


def test_a_stale_nodes_sandboxes_leave_lists_gets_and_watches(clock: ManualClock) -> None:
    store, source = _store(clock, node("a", entry("default/x")), node("b", entry("default/y")))
    watcher = Watcher(store, Query.parse(None))
    assert [e.type for e in watcher.open()] == ["ADDED", "ADDED"]

    # a keeps publishing, b stops: 91 s later b is stale.
    clock.advance(91)
    source.apply(node("a", entry("default/x"), stamp=T0 + timedelta(seconds=91)))

    assert _names(store.list(Query.parse(None))) == ["default/x"]
    with pytest.raises(NotFound):
        store.get("default", "y")
    events = watcher.tick()
    assert [(e.type, e.object["metadata"]["name"]) for e in events] == [("DELETED", "y")]


def test_a_fleet_watch_reports_added_modified_and_deleted(clock: ManualClock) -> None:
    store, source = _store(clock, node("a", entry("default/x")))
    watcher = Watcher(store, Query.parse("default"))
    watcher.open()
    assert watcher.tick() == []

    source.apply(node("a", entry("default/x", "Hibernated"), entry("default/new")))
    assert sorted((e.type, e.object["metadata"]["name"]) for e in watcher.tick()) == [
        ("ADDED", "new"),
        ("MODIFIED", "x"),
    ]
    source.apply(node("a", entry("default/new")))
    assert [(e.type, e.object["metadata"]["name"]) for e in watcher.tick()] == [("DELETED", "x")]


def test_send_initial_events_ends_the_burst_with_the_bookmark(clock: ManualClock) -> None:
    store, _ = _store(clock, node("a", entry("default/x")))
    events = Watcher(store, Query.parse("default")).open(send_initial_events=True)
    assert [e.type for e in events] == ["ADDED", "BOOKMARK"]
    annotations = events[-1].object["metadata"]["annotations"]
    assert annotations == {"k8s.io/initial-events-end": "true"}


def test_a_pinned_watch_reads_only_its_node_and_idle_ticks_send_nothing(
    clock: ManualClock,
) -> None:
    others = [node(f"n{i}", *(entry(f"default/o{i}-{j}") for j in range(50))) for i in range(5)]
    store, source = _store(clock, node("a", entry("default/x")), *others)
    watcher = Watcher(store, Query.parse("default", fields="metadata.name=x"))
    assert [e.type for e in watcher.open()] == ["ADDED"]
    fleet_reads = store.stats.fleet_reads

    for _ in range(5):
        assert watcher.tick() == []
    assert store.stats.fleet_reads == fleet_reads  # never swept the fleet
    assert store.stats.live_asks == {}  # and asked no agent

    source.apply(node("a", entry("default/x", "Hibernated")))
    (event,) = watcher.tick()
    assert event.type == "MODIFIED"
    assert event.object["metadata"]["labels"]["sandbox.cocoonstack.io/phase"] == "Hibernated"
    assert store.stats.fleet_reads == fleet_reads


def test_a_name_moved_to_another_node_is_deleted_then_added(clock: ManualClock) -> None:
    store, source = _store(clock, node("a", entry("default/x")), node("b"))
    watcher = Watcher(store, Query.parse("default", fields="metadata.name=x"))
    watcher.open()

    source.apply(node("a"))
    source.apply(node("b", entry("default/x", claim_id="sb_other")))

    assert [e.type for e in watcher.tick()] == ["DELETED"]
    (added,) = watcher.tick()
    assert added.type == "ADDED"
    assert added.object["status"]["nodeName"] == "b"


def test_the_same_name_claimed_again_on_its_node_is_modified(clock: ManualClock) -> None:
    store, source = _store(clock, node("a", entry("default/x")))
    watcher = Watcher(store, Query.parse("default", fields="metadata.name=x"))
    watcher.open()
    source.apply(node("a", entry("default/x", claim_id="sb_again")))
    assert [e.type for e in watcher.tick()] == ["MODIFIED"]


def test_an_absent_name_sweeps_inventories_and_asks_no_agent(clock: ManualClock) -> None:
    store, source = _store(clock, node("a"))
    watcher = Watcher(store, Query.parse("default", fields="metadata.name=later"))
    assert watcher.open() == []
    assert watcher.tick() == []
    source.apply(node("a", entry("default/later")))
    assert [e.type for e in watcher.tick()] == ["ADDED"]
    assert store.stats.live_asks == {}


def test_a_pinned_list_and_watch_agree_on_the_duplicate_their_selectors_accept(
    clock: ManualClock,
) -> None:
    paused = entry("default/dup", "Hibernated", claim_id="sb_paused")
    running = entry("default/dup", "Running", claim_id="sb_running")
    store, _ = _store(clock, node("a", paused), node("b", running))
    store.index.remember_name("default", "dup", "a")  # the index points at the paused one
    query = Query.parse(
        "default", labels="sandbox.cocoonstack.io/phase=Running", fields="metadata.name=dup"
    )

    listed = store.list(query)
    watched = Watcher(store, query).open()

    assert [o["status"]["nodeName"] for o in listed] == ["b"]
    assert [e.object["status"]["nodeName"] for e in watched] == ["b"]


def test_a_fleet_list_selects_both_duplicates(clock: ManualClock) -> None:
    store, _ = _store(
        clock,
        node("a", entry("default/dup", claim_id="sb_1")),
        node("b", entry("default/dup", claim_id="sb_2")),
    )
    objects = store.list(Query.parse("default"))
    assert [o["status"]["nodeName"] for o in objects] == ["a", "b"]

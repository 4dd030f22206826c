"""The fleet (non-pinned) watch: a tick rescans only the nodes whose record changed or
whose freshness did, and reports one object per name (the first accepting node's)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandboxctl.clock import ManualClock
from sandboxctl.core.freshness import FreshnessRule, ReferenceMode
from sandboxctl.core.model import Entry, NodeInventory
from sandboxctl.core.sandboxes import sandbox_object
from sandboxctl.core.watching import WatchEvent
from sandboxctl.inventory.memory import MemoryInventorySource
from sandboxctl.store import Query, SandboxStore
from sandboxctl.store import watch as watch_module
from sandboxctl.store.watch import Watcher, list_version
from tests.store.inventories import T0
from tests.store.inventories import entry as _entry
from tests.store.inventories import node as _node

RUNNING = "sandbox.cocoonstack.io/phase=Running"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


def _store(
    clock: ManualClock, *nodes: NodeInventory, rule: FreshnessRule | None = None
) -> tuple[SandboxStore, MemoryInventorySource]:
    source = MemoryInventorySource(nodes, clock=clock)
    return SandboxStore(source, rule or FreshnessRule(), clock=clock), source


def _seen(events: list[WatchEvent]) -> list[tuple[str, str, str]]:
    """(type, name, node) of each event."""
    return [(e.type, e.object["metadata"]["name"], e.object["status"]["nodeName"]) for e in events]


def _key(obj: dict[str, Any]) -> str:
    return f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"


def _rv(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["resourceVersion"])


# --- opening and idle ticks -----------------------------------------------------------------


def test_open_is_one_fleet_read_and_sends_one_added_per_name_sorted(clock: ManualClock) -> None:
    store, _ = _store(
        clock,
        _node("b", _entry("default/z"), _entry("team/a")),
        _node("a", _entry("default/y"), _entry("a-b/x")),
    )
    events = Watcher(store, Query.parse(None)).open(send_initial_events=True)

    assert [e.type for e in events] == ["ADDED"] * 4 + ["BOOKMARK"]
    assert [_key(e.object) for e in events[:4]] == ["a-b/x", "default/y", "default/z", "team/a"]
    assert events[-1].object["metadata"]["resourceVersion"] == list_version(
        [e.object for e in events[:4]]
    )
    assert (store.stats.fleet_reads, store.stats.node_reads) == (1, 0)


def test_idle_ticks_send_nothing_and_read_no_node(clock: ManualClock) -> None:
    nodes = [_node(f"n{i}", *(_entry(f"default/o{i}-{j}") for j in range(20))) for i in range(5)]
    store, _ = _store(clock, *nodes)
    watcher = Watcher(store, Query.parse("default"))
    assert len(watcher.open()) == 100
    reads = (store.stats.fleet_reads, store.stats.node_reads)

    for _ in range(5):
        assert watcher.tick() == []
    assert (store.stats.fleet_reads, store.stats.node_reads) == reads
    assert store.stats.live_asks == {}


def test_one_node_republished_is_one_node_read_and_one_modified(clock: ManualClock) -> None:
    entries = {i: [_entry(f"default/o{i}-{j}") for j in range(20)] for i in range(5)}
    store, source = _store(clock, *(_node(f"n{i}", *entries[i]) for i in range(5)))
    watcher = Watcher(store, Query.parse("default"))
    watcher.open()
    fleet_reads, node_reads = store.stats.fleet_reads, store.stats.node_reads

    # n2 publishes again: equal entries (new objects) but one with a new phase
    republished = [
        _entry(f"default/o2-{j}", "Hibernated" if j == 7 else "Running") for j in range(20)
    ]
    source.apply(_node("n2", *republished))

    assert _seen(watcher.tick()) == [("MODIFIED", "o2-7", "n2")]
    assert store.stats.node_reads == node_reads + 1
    assert store.stats.fleet_reads == fleet_reads
    assert watcher.tick() == []
    assert store.stats.node_reads == node_reads + 1


def test_a_publish_outside_the_query_reads_one_node_and_sends_nothing(
    clock: ManualClock,
) -> None:
    store, source = _store(clock, _node("a", _entry("default/x")), _node("b", _entry("team/y")))
    watcher = Watcher(store, Query.parse("default"))
    watcher.open()
    reads = store.stats.node_reads

    source.apply(_node("b", _entry("team/y", "Hibernated"), _entry("team/z")))
    assert watcher.tick() == []
    assert store.stats.node_reads == reads + 1


def test_a_republish_reuses_the_objects_of_unchanged_entries(
    clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, source = _store(clock, _node("a", *(_entry(f"default/x{j}") for j in range(10))))
    watcher = Watcher(store, Query.parse("default"))
    watcher.open()
    built: list[str] = []

    def counting(located: Any) -> dict[str, Any]:
        built.append(located.entry.name)
        return sandbox_object(located)

    monkeypatch.setattr(watch_module, "sandbox_object", counting)
    changed = [_entry(f"default/x{j}", "Hibernated" if j == 3 else "Running") for j in range(10)]
    source.apply(_node("a", *changed, _entry("default/new")))

    assert _seen(watcher.tick()) == [("ADDED", "new", "a"), ("MODIFIED", "x3", "a")]
    assert built == ["default/x3", "default/new"]


def test_a_failed_tick_keeps_the_state_and_the_next_one_reports(
    clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, source = _store(clock, _node("a", _entry("default/x")))
    watcher = Watcher(store, Query.parse("default"))
    watcher.open()
    source.apply(_node("a", _entry("default/x", "Hibernated"), _entry("default/y")))

    def failing(located: Any) -> dict[str, Any]:
        raise RuntimeError("poll failed")

    with monkeypatch.context() as patch:
        patch.setattr(watch_module, "sandbox_object", failing)
        with pytest.raises(RuntimeError):
            watcher.tick()
    assert _seen(watcher.tick()) == [("MODIFIED", "x", "a"), ("ADDED", "y", "a")]


def test_events_come_added_and_modified_first_then_deleted_by_name(clock: ManualClock) -> None:
    store, source = _store(
        clock,
        _node("a", _entry("default/b"), _entry("default/d")),
        _node("b", _entry("default/a"), _entry("default/c")),
    )
    watcher = Watcher(store, Query.parse("default"))
    watcher.open()

    source.apply(_node("a", _entry("default/e"), _entry("default/d", "Hibernated")))
    source.apply(_node("b", _entry("default/c"), _entry("default/aa")))

    assert _seen(watcher.tick()) == [
        ("ADDED", "aa", "b"),
        ("MODIFIED", "d", "a"),
        ("ADDED", "e", "a"),
        ("DELETED", "a", "b"),
        ("DELETED", "b", "a"),
    ]


# --- duplicates -----------------------------------------------------------------------------


def test_a_name_on_two_nodes_is_one_object_from_the_first_node(clock: ManualClock) -> None:
    store, source = _store(
        clock,
        _node("b", _entry("default/dup", claim_id="sb_on_b")),
        _node("c", _entry("default/dup", claim_id="sb_on_c")),
    )
    watcher = Watcher(store, Query.parse("default"))
    assert _seen(watcher.open()) == [("ADDED", "dup", "b")]

    # a node earlier in name order takes the name over: the winner switches
    source.apply(_node("a", _entry("default/dup", claim_id="sb_on_a")))
    (event,) = watcher.tick()
    assert _seen([event]) == [("MODIFIED", "dup", "a")]
    assert event.object["metadata"]["annotations"]["sandbox.cocoonstack.io/claim-id"] == "sb_on_a"

    # gone from the first node: the second one's entry is the object now
    source.apply(_node("a"))
    assert _seen(watcher.tick()) == [("MODIFIED", "dup", "b")]
    source.apply(_node("b"))
    assert _seen(watcher.tick()) == [("MODIFIED", "dup", "c")]

    # gone from the last node: deleted, with the last object sent
    source.apply(_node("c"))
    assert _seen(watcher.tick()) == [("DELETED", "dup", "c")]
    assert watcher.known() == {}


def test_a_duplicate_with_the_same_version_moves_without_an_event(clock: ManualClock) -> None:
    same = _entry("default/dup")
    store, source = _store(clock, _node("a", same), _node("b", same))
    watcher = Watcher(store, Query.parse("default"))
    assert _seen(watcher.open()) == [("ADDED", "dup", "a")]

    source.apply(_node("a"))
    assert watcher.tick() == []  # the version does not hash the node
    assert watcher.known()["default/dup"]["status"]["nodeName"] == "b"

    source.apply(_node("b"))
    deleted = watcher.tick()
    assert _seen(deleted) == [("DELETED", "dup", "b")]  # the latest object, not the first


def test_both_duplicates_removed_at_once_is_one_deleted(clock: ManualClock) -> None:
    store, source = _store(
        clock,
        _node("a", _entry("default/dup", claim_id="sb_1")),
        _node("b", _entry("default/dup", claim_id="sb_2")),
    )
    watcher = Watcher(store, Query.parse("default"))
    watcher.open()
    source.apply(_node("a"))
    source.apply(_node("b"))
    assert _seen(watcher.tick()) == [("DELETED", "dup", "a")]


def test_a_duplicate_the_selector_rejects_does_not_win(clock: ManualClock) -> None:
    store, source = _store(
        clock,
        _node("a", _entry("default/dup", "Hibernated", claim_id="sb_paused")),
        _node("b", _entry("default/dup", "Running", claim_id="sb_running")),
    )
    watcher = Watcher(store, Query.parse("default", labels=RUNNING))
    assert _seen(watcher.open()) == [("ADDED", "dup", "b")]

    source.apply(_node("a", _entry("default/dup", "Running", claim_id="sb_paused")))
    assert _seen(watcher.tick()) == [("MODIFIED", "dup", "a")]


# --- freshness ------------------------------------------------------------------------------


def test_a_node_going_stale_is_deleted_and_its_next_publish_added(clock: ManualClock) -> None:
    store, source = _store(
        clock, _node("a", _entry("default/x")), _node("b", _entry("default/y"), _entry("default/z"))
    )
    watcher = Watcher(store, Query.parse(None))
    watcher.open()
    b_record = store.source.snapshot().record("b")

    # a keeps publishing, b does not: 91 s on, b is stale with its record untouched
    clock.advance(91)
    source.apply(_node("a", _entry("default/x"), stamp=T0 + timedelta(seconds=91)))
    assert store.source.snapshot().record("b") is b_record
    reads = store.stats.node_reads

    assert _seen(watcher.tick()) == [("DELETED", "y", "b"), ("DELETED", "z", "b")]
    assert store.stats.node_reads == reads + 1  # a's new record; b is dropped unread
    assert watcher.tick() == []

    source.apply(_node("b", _entry("default/y"), stamp=T0 + timedelta(seconds=91)))
    assert _seen(watcher.tick()) == [("ADDED", "y", "b")]


def test_the_clock_alone_can_make_a_node_stale(clock: ManualClock) -> None:
    # Extrapolating: the reference runs on from the newest stamp as the reader's clock
    # moves, so with no publish at all (the same snapshot) a node can go stale.
    rule = FreshnessRule(mode=ReferenceMode.EXTRAPOLATE, stale_after=timedelta(seconds=90))
    clock.advance(70)
    store, source = _store(
        clock,
        _node("a", _entry("default/x")),
        _node("b", _entry("default/y"), stamp=T0 + timedelta(seconds=70)),
        rule=rule,
    )
    watcher = Watcher(store, Query.parse(None))
    assert _seen(watcher.open()) == [("ADDED", "x", "a"), ("ADDED", "y", "b")]
    snapshot = source.snapshot()
    reads = store.stats.node_reads

    clock.advance(10)  # the cutoff moves, nobody goes stale: nothing to read
    assert watcher.tick() == []
    assert store.stats.node_reads == reads

    clock.advance(20)
    assert source.snapshot() is snapshot
    assert _seen(watcher.tick()) == [("DELETED", "x", "a")]

    source.apply(_node("a", _entry("default/x"), stamp=clock.now()))
    assert _seen(watcher.tick()) == [("ADDED", "x", "a")]


def test_a_stale_node_fresh_again_with_the_same_record_is_added(clock: ManualClock) -> None:
    # In publish mode the reference is the newest stamp: when the node that set it
    # leaves, the reference moves back and an older node is fresh again, unchanged.
    later = T0 + timedelta(seconds=100)
    clock.advance(100)
    store, source = _store(
        clock, _node("a", _entry("default/x")), _node("b", _entry("default/y"), stamp=later)
    )
    watcher = Watcher(store, Query.parse(None))
    assert _seen(watcher.open()) == [("ADDED", "y", "b")]
    a_record = source.snapshot().record("a")

    source.remove("b")
    assert source.snapshot().record("a") is a_record
    assert _seen(watcher.tick()) == [("ADDED", "x", "a"), ("DELETED", "y", "b")]


# --- selectors ------------------------------------------------------------------------------


def test_a_label_selector_watch_reports_only_accepted_entries(clock: ManualClock) -> None:
    store, source = _store(
        clock,
        _node("a", _entry("default/x"), _entry("default/y", "Hibernated")),
        _node("b", _entry("other/z")),
    )
    watcher = Watcher(store, Query.parse("default", labels=RUNNING))
    assert _seen(watcher.open()) == [("ADDED", "x", "a")]

    # x stops matching (DELETED, though still listed); y starts (ADDED)
    source.apply(_node("a", _entry("default/x", "Hibernated"), _entry("default/y")))
    assert _seen(watcher.tick()) == [("ADDED", "y", "a"), ("DELETED", "x", "a")]
    # another namespace is never reported
    source.apply(_node("b", _entry("other/z", "Hibernated"), _entry("other/w")))
    assert watcher.tick() == []
    assert list(watcher.known()) == ["default/y"]


def test_a_field_selector_on_the_node_follows_entries_onto_it(clock: ManualClock) -> None:
    store, source = _store(clock, _node("a", _entry("default/x")), _node("b"))
    watcher = Watcher(store, Query.parse(None, fields="status.nodeName=b"))
    assert watcher.open() == []
    source.apply(_node("b", _entry("default/x")))
    assert _seen(watcher.tick()) == [("ADDED", "x", "b")]


# --- against a full recompute ---------------------------------------------------------------

NODES = ("a", "b", "c")
NAMES = ("default/x", "default/y", "team/x")
RULES = (FreshnessRule(), FreshnessRule(mode=ReferenceMode.EXTRAPOLATE))
QUERIES = (
    Query.parse(None),
    Query.parse("default"),
    Query.parse(None, labels=RUNNING),
    Query.parse("default", fields="status.nodeName!=b"),
)

_entries = st.builds(
    Entry,
    name=st.sampled_from(NAMES),
    phase=st.sampled_from(("Running", "Hibernated")),
    id=st.sampled_from(("sb_1", "sb_2")),
)
_ops = st.one_of(
    # a publish: the node's entries (a name may repeat), stamped now or some time ago
    st.tuples(
        st.just("apply"),
        st.sampled_from(NODES),
        st.lists(_entries, max_size=4),
        st.sampled_from((0, 0, 45, 70, 100)),
    ),
    st.tuples(st.just("advance"), st.integers(min_value=1, max_value=120)),
    st.tuples(st.just("remove"), st.sampled_from(NODES)),
    st.tuples(st.just("same"), st.sampled_from(NODES)),  # the same inventory, a new record
)


def _recomputed(store: SandboxStore, query: Query) -> dict[str, dict[str, Any]]:
    """Each name's object by the rule, read straight off the view: the first fresh node
    in name order whose entry under the name the query accepts."""
    view = store.view()
    names = sorted({loc.entry.namespaced_name for loc in view.entries(query.namespace)})
    out = {}
    for namespace, name in names:
        for located in view.lookup_name(namespace, name):
            if query.accepts(located):
                out[f"{namespace}/{name}"] = sandbox_object(located)
                break
    return out


@settings(database=None, deadline=None, max_examples=150)
@given(
    rule=st.sampled_from(RULES),
    query=st.sampled_from(QUERIES),
    start=st.lists(_entries, max_size=3),
    ops=st.lists(_ops, max_size=14),
)
def test_the_incremental_watch_always_knows_what_a_fresh_one_would(
    rule: FreshnessRule, query: Query, start: list[Entry], ops: list[tuple[Any, ...]]
) -> None:
    clock = ManualClock(T0)
    store, source = _store(clock, *(_node(n, *start) for n in NODES[:2]), rule=rule)
    watcher = Watcher(store, query)
    client = {_key(event.object): event.object for event in watcher.open()}  # a client's view

    for op in ops:
        if op[0] == "apply":
            _, node, entries, ago = op
            source.apply(_node(node, *entries, stamp=clock.now() - timedelta(seconds=ago)))
        elif op[0] == "advance":
            clock.advance(op[1])
        elif op[0] == "remove":
            source.remove(op[1])
        else:
            record = source.snapshot().record(op[1])
            if record is not None:
                source.apply(record.inventory)

        before = watcher.known()
        events = watcher.tick()
        after = watcher.known()
        for event in events:
            key = _key(event.object)
            if event.type == "ADDED":
                assert key not in client
                assert event.object is after[key]
                client[key] = event.object
            elif event.type == "MODIFIED":
                assert _rv(client[key]) != _rv(event.object)
                assert event.object is after[key]
                client[key] = event.object
            else:
                assert event.type == "DELETED"
                assert key not in after
                assert event.object is before[key]  # the last object, sent or not
                assert _rv(client.pop(key)) == _rv(event.object)

        fresh = {_key(e.object): e.object for e in Watcher(store, query).open()}
        known = watcher.known()
        assert known == fresh
        assert known == _recomputed(store, query)
        assert {k: _rv(o) for k, o in client.items()} == {k: _rv(o) for k, o in known.items()}

"""The store's reads on a static source: selectors, versions, lists, pages, staleness."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest

from sandboxctl.clock import ManualClock
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.model import NodeInventory
from sandboxctl.core.sandboxes import ANNOTATION_CLAIM_ID as CLAIM_ID
from sandboxctl.inventory.memory import MemoryInventorySource
from sandboxctl.store import NotFound, Query, SandboxStore
from sandboxctl.store.errors import Expired
from sandboxctl.store.lists import TOKEN_SECONDS, BadContinue
from tests.store.inventories import T0, entry, node


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


def _store(
    clock: ManualClock, *nodes: NodeInventory, retain: int = 100
) -> tuple[SandboxStore, MemoryInventorySource]:
    source = MemoryInventorySource(nodes, clock=clock)
    store = SandboxStore(source, FreshnessRule(), clock=clock, retain=retain, first_version=1000)
    return store, source


RUNNING = "sandbox.cocoonstack.io/phase=Running"


def _names(objects: list[dict[str, Any]]) -> list[str]:
    return [f"{o['metadata']['namespace']}/{o['metadata']['name']}" for o in objects]


def _rv(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


def test_list_filters_by_namespace_and_labels_and_sorts(clock: ManualClock) -> None:
    store, _ = _store(
        clock,
        node("b", entry("default/z"), entry("team/a", "Hibernated")),
        node("a", entry("default/y"), entry("team/b"), entry("team-x/c")),
    )
    everything = ["default/y", "default/z", "team/a", "team/b", "team-x/c"]
    assert _names(store.list(Query.parse(None)).items) == everything
    assert _names(store.list(Query.parse("team")).items) == ["team/a", "team/b"]
    running = Query.parse(None, labels="sandbox.cocoonstack.io/phase=Running")
    assert _names(store.list(running).items) == ["default/y", "default/z", "team/b", "team-x/c"]
    on_b = Query.parse(None, fields="status.nodeName=b")
    assert _names(store.list(on_b).items) == ["default/z", "team/a"]


def test_an_unsupported_field_selector_names_the_field() -> None:
    with pytest.raises(InvalidValueError, match=r'field selector "spec.x" is not supported'):
        Query.parse("default", fields="spec.x=y")


def test_get_finds_a_sandbox_and_misses_are_not_found(clock: ManualClock) -> None:
    store, _ = _store(clock, node("a", entry("default/x")))
    obj = store.get("default", "x")
    assert obj["status"]["nodeName"] == "a"
    assert obj == store.list(Query.parse("default")).items[0]
    with pytest.raises(NotFound):
        store.get("default", "nope")


# --- resourceVersions ------------------------------------------------------------------


def test_a_list_carries_the_version_of_its_newest_change(clock: ManualClock) -> None:
    store, source = _store(clock, node("a", entry("default/x")))
    first = store.list(Query.parse(None))
    assert first.version == 1000
    assert [_rv(o) for o in first.items] == [1000]

    source.apply(node("a", entry("default/x"), entry("default/y")))
    second = store.list(Query.parse(None))
    assert second.version == 1001
    assert [_rv(o) for o in second.items] == [1000, 1001]  # x is unchanged: it keeps 1000


def test_an_unchanged_object_keeps_its_version_across_republishes(clock: ManualClock) -> None:
    store, source = _store(clock, node("a", entry("default/x")))
    before = store.get("default", "x")
    for _ in range(3):
        source.apply(node("a", entry("default/x")))
        assert store.get("default", "x") is before


def test_any_change_to_an_entry_is_a_new_version(clock: ManualClock) -> None:
    store, source = _store(clock, node("a", entry("default/x")))
    before = _rv(store.get("default", "x"))
    source.apply(node("a", entry("default/x", "Hibernated")))
    after = store.get("default", "x")
    assert _rv(after) > before
    assert after["metadata"]["labels"]["sandbox.cocoonstack.io/phase"] == "Hibernated"


def test_a_restarted_store_never_reuses_a_version() -> None:
    source = MemoryInventorySource([node("a", entry("default/x"))])
    first = SandboxStore(source, FreshnessRule()).list(Query.parse(None)).version
    second = SandboxStore(source, FreshnessRule()).list(Query.parse(None)).version
    assert second > first


def test_one_republished_node_is_one_rescan(clock: ManualClock) -> None:
    nodes = [node(f"n{i}", *(entry(f"default/o{i}-{j}") for j in range(20))) for i in range(5)]
    store, source = _store(clock, *nodes)
    assert len(store.list(Query.parse(None)).items) == 100
    rescans = store.stats.rescans
    for _ in range(3):
        store.list(Query.parse(None))
    assert store.stats.rescans == rescans  # nothing changed: nothing read

    source.apply(node("n2", *(entry(f"default/o2-{j}") for j in range(20))))
    store.list(Query.parse(None))
    assert store.stats.rescans == rescans + 1


# --- duplicates and staleness ----------------------------------------------------------


def test_a_name_on_two_nodes_is_one_object_from_the_first_node(clock: ManualClock) -> None:
    store, source = _store(
        clock,
        node("b", entry("default/dup", claim_id="sb_b")),
        node("a", entry("default/dup", "Hibernated", claim_id="sb_a")),
    )
    (listed,) = store.list(Query.parse("default")).items
    assert listed["status"]["nodeName"] == "a"
    # every query reads the same object: one that rejects it sees nothing
    running = Query.parse("default", labels="sandbox.cocoonstack.io/phase=Running")
    assert store.list(running).items == []
    pinned = Query.parse("default", fields="metadata.name=dup")
    assert store.list(pinned).items == [listed]

    source.remove("a")
    (listed,) = store.list(Query.parse("default")).items
    assert listed["status"]["nodeName"] == "b"


def _held_by(obj: dict[str, Any]) -> tuple[str, str]:
    """The node and the id (as the SDK spells it, sb-...) of a served object."""
    return obj["status"]["nodeName"], obj["metadata"]["annotations"][CLAIM_ID]


def test_a_pinned_list_and_watch_show_the_duplicate_their_selectors_accept(
    clock: ManualClock,
) -> None:
    # the name resolves to a's Paused claim; b's Running claim has the same name
    paused = entry("default/dup", "Hibernated", claim_id="sb_a")
    store, source = _store(
        clock, node("a", paused), node("b", entry("default/dup", claim_id="sb_b"))
    )
    running = Query.parse("default", labels=RUNNING, fields="metadata.name=dup")
    (listed,) = store.list(running).items
    assert _held_by(listed) == ("b", "sb-b")
    watch = store.watch(running, send_initial_events=True)
    opening = watch.open()
    assert [e.type for e in opening] == ["ADDED", "BOOKMARK"]
    assert opening[0].object is listed
    # without selectors, or across the fleet, the name still reads as the first holder
    assert _held_by(store.get("default", "dup")) == ("a", "sb-a")
    assert store.list(Query.parse("default", labels=RUNNING)).items == []
    (unselected,) = store.list(Query.parse("default", fields="metadata.name=dup")).items
    assert _held_by(unselected) == ("a", "sb-a")

    source.apply(node("a", entry("default/dup", claim_id="sb_a")))  # a runs: it shows
    (event,) = watch.poll()
    assert (event.type, _held_by(event.object)) == ("MODIFIED", ("a", "sb-a"))
    source.apply(node("a", paused))  # paused again: b's shows through
    (event,) = watch.poll()
    assert (event.type, _held_by(event.object)) == ("MODIFIED", ("b", "sb-b"))
    assert _rv(event.object) == watch.version  # at the change that showed it
    assert store.list(running).items == [event.object]
    source.apply(node("b", entry("default/dup", "Hibernated", claim_id="sb_b")))
    (event,) = watch.poll()
    assert (event.type, _held_by(event.object)) == ("DELETED", ("b", "sb-b"))
    assert store.list(running).items == []
    source.apply(node("b", entry("default/dup", claim_id="sb_b2")))  # claimed again on b
    (event,) = watch.poll()
    assert (event.type, _held_by(event.object)) == ("ADDED", ("b", "sb-b2"))
    source.remove("b")
    source.remove("a")
    (event,) = watch.poll()
    assert (event.type, _held_by(event.object)) == ("DELETED", ("b", "sb-b2"))


def test_a_duplicates_change_alone_is_no_event_for_a_watch_that_does_not_show_it(
    clock: ManualClock,
) -> None:
    store, source = _store(clock, node("a", entry("default/dup", claim_id="sb_a")))
    fleet = store.watch(Query.parse("default"))
    pinned = store.watch(Query.parse("default", labels=RUNNING, fields="metadata.name=dup"))
    assert len(fleet.open()) == len(pinned.open()) == 1
    source.apply(node("b", entry("default/dup", claim_id="sb_b")))
    source.apply(node("b", entry("default/dup", "Hibernated", claim_id="sb_b")))
    assert fleet.poll() == pinned.poll() == []
    (listed,) = store.list(Query.parse("default")).items
    assert _held_by(listed) == ("a", "sb-a")


def test_a_pinned_watch_agrees_with_its_list_and_deletes_what_it_showed(
    clock: ManualClock,
) -> None:
    # a's Paused claim wins the name; the watch shows b's Running one; c holds a third
    paused = entry("default/dup", "Hibernated", claim_id="sb_a")
    store, source = _store(
        clock,
        node("a", paused),
        node("b", entry("default/dup", claim_id="sb_b")),
        node("c", entry("default/dup", "Hibernated", claim_id="sb_c")),
    )
    running = Query.parse("default", labels=RUNNING, fields="metadata.name=dup")
    watch = store.watch(running)
    assert [_held_by(e.object) for e in watch.open()] == [("b", "sb-b")]
    source.apply(node("c", entry("default/dup", "Hibernated", claim_id="sb_c2")))
    source.apply(node("a", entry("default/dup", "Hibernated", claim_id="sb_a2")))
    for event in watch.poll():  # b's unchanged object, re-served at each change's version
        assert (event.type, _held_by(event.object)) == ("MODIFIED", ("b", "sb-b"))
    assert store.list(running).items[0]["metadata"]["resourceVersion"] == str(watch.version)
    source.remove("b")  # the holder it showed is gone: its last state, at this version
    (event,) = watch.poll()
    assert (event.type, _held_by(event.object)) == ("DELETED", ("b", "sb-b"))
    assert _rv(event.object) == watch.version


def test_a_stale_nodes_sandboxes_leave_lists_gets_and_watches(clock: ManualClock) -> None:
    store, source = _store(clock, node("a", entry("default/x")), node("b", entry("default/y")))
    watch = store.watch(Query.parse(None))
    assert [e.type for e in watch.open()] == ["ADDED", "ADDED"]

    # a keeps publishing, b stops: 91 s later b is stale.
    clock.advance(91)
    source.apply(node("a", entry("default/x"), stamp=T0 + timedelta(seconds=91)))

    assert _names(store.list(Query.parse(None)).items) == ["default/x"]
    with pytest.raises(NotFound):
        store.get("default", "y")
    assert [(e.type, e.object["metadata"]["name"]) for e in watch.poll()] == [("DELETED", "y")]


# --- paging ----------------------------------------------------------------------------


def test_limit_and_continue_page_through_one_state(clock: ManualClock) -> None:
    store, source = _store(clock, node("a", *(entry(f"default/s{i}") for i in range(5))))
    query = Query.parse("default")
    first = store.list(query, limit=2)
    assert _names(first.items) == ["default/s0", "default/s1"]
    assert first.continue_token is not None
    assert first.remaining is None  # a namespaced list does not count what follows

    # changes between pages are not seen by the pages of the first list
    source.apply(node("a", entry("default/s0"), entry("default/s9")))
    second = store.list(query, limit=2, continue_token=first.continue_token)
    third = store.list(query, limit=2, continue_token=second.continue_token)
    assert _names(second.items) == ["default/s2", "default/s3"]
    assert _names(third.items) == ["default/s4"]
    assert third.continue_token is None
    assert first.version == second.version == third.version
    assert _names(store.list(query).items) == ["default/s0", "default/s9"]


def test_an_all_namespaces_page_counts_what_remains(clock: ManualClock) -> None:
    store, _ = _store(clock, node("a", *(entry(f"ns{i}/x") for i in range(5))))
    page = store.list(Query.parse(None), limit=2)
    assert page.remaining == 3


def test_a_tampered_continue_token_is_refused(clock: ManualClock) -> None:
    store, _ = _store(clock, node("a", entry("default/x")))
    for token in ("not-base64!", "eyJ2IjoxfQ", "bnVsbA"):  # garbage, {"v":1}, null
        with pytest.raises(BadContinue):
            store.list(Query.parse(None), limit=1, continue_token=token)


def test_a_continue_token_expires(clock: ManualClock) -> None:
    store, source = _store(clock, node("a", entry("default/x"), entry("default/y")))
    token = store.list(Query.parse(None), limit=1).continue_token
    assert token is not None
    source.apply(node("a", entry("default/z")))  # the state it names is no longer current
    clock.advance(TOKEN_SECONDS + 1)
    with pytest.raises(Expired):
        store.list(Query.parse(None), limit=1, continue_token=token)


# --- watches ---------------------------------------------------------------------------


def test_a_watch_from_a_lists_version_sends_only_later_changes(clock: ManualClock) -> None:
    store, source = _store(clock, node("a", entry("default/x"), entry("default/y")))
    listed = store.list(Query.parse(None))
    watch = store.watch(Query.parse(None), listed.version)
    assert watch.open() == []

    source.apply(node("a", entry("default/x", "Hibernated"), entry("default/z")))
    events = watch.poll()
    assert [(e.type, e.object["metadata"]["name"]) for e in events] == [
        ("MODIFIED", "x"),
        ("DELETED", "y"),
        ("ADDED", "z"),
    ]
    assert [_rv(e.object) for e in events] == [1001, 1002, 1003]  # one version per change
    assert watch.poll() == []


def test_a_watch_from_a_later_version_skips_what_came_before(clock: ManualClock) -> None:
    store, source = _store(clock, node("a"))
    source.apply(node("a", entry("default/x")))
    version = store.list(Query.parse(None)).version
    source.apply(node("a", entry("default/x"), entry("default/y")))
    watch = store.watch(Query.parse(None), version)
    assert [e.object["metadata"]["name"] for e in watch.open()] == ["y"]


def test_a_watch_without_a_version_starts_with_the_current_objects(clock: ManualClock) -> None:
    store, _ = _store(clock, node("a", entry("team/b"), entry("default/x")))
    events = store.watch(Query.parse(None), send_initial_events=True).open()
    assert [e.type for e in events] == ["ADDED", "ADDED", "BOOKMARK"]
    assert _names([e.object for e in events[:2]]) == ["default/x", "team/b"]
    end = events[-1].object["metadata"]
    assert end["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert end["resourceVersion"] == "1000"


def test_a_version_older_than_the_log_is_expired(clock: ManualClock) -> None:
    store, source = _store(clock, node("a"), retain=2)
    old = store.list(Query.parse(None)).version
    for i in range(5):
        source.apply(node("a", entry(f"default/x{i}")))
        store.list(Query.parse(None))
    with pytest.raises(Expired):
        store.watch(Query.parse(None), old).open()


def test_a_version_this_server_never_gave_is_expired(clock: ManualClock) -> None:
    store, _ = _store(clock, node("a"))
    with pytest.raises(Expired):
        store.watch(Query.parse(None), 999_999_999).open()


def test_a_watch_that_falls_behind_the_log_is_expired(clock: ManualClock) -> None:
    store, source = _store(clock, node("a"), retain=2)
    watch = store.watch(Query.parse(None), store.list(Query.parse(None)).version)
    watch.open()
    for i in range(5):
        source.apply(node("a", entry(f"default/x{i}")))
        store.list(Query.parse(None))
    with pytest.raises(Expired):
        watch.poll()


def test_a_selector_watch_sees_objects_enter_and_leave_it(clock: ManualClock) -> None:
    store, source = _store(clock, node("a", entry("default/x")))
    running = Query.parse("default", labels="sandbox.cocoonstack.io/phase=Running")
    watch = store.watch(running, store.list(running).version)
    watch.open()

    source.apply(node("a", entry("default/x", "Hibernated"), entry("default/y", "Hibernated")))
    (left,) = watch.poll()  # x stops matching: DELETED, with the new object; y never matched
    assert (left.type, left.object["metadata"]["name"]) == ("DELETED", "x")
    assert left.object["metadata"]["labels"]["sandbox.cocoonstack.io/phase"] == "Hibernated"

    source.apply(node("a", entry("default/x"), entry("default/y", "Hibernated")))
    (back,) = watch.poll()
    assert (back.type, back.object["metadata"]["name"]) == ("ADDED", "x")
    source.apply(node("b", entry("other/z")))  # another namespace is never reported
    assert watch.poll() == []


def test_a_pinned_watch_sees_only_its_name_and_asks_no_agent(clock: ManualClock) -> None:
    others = [node(f"n{i}", *(entry(f"default/o{i}-{j}") for j in range(50))) for i in range(5)]
    store, source = _store(clock, node("a", entry("default/x")), *others)
    pinned = Query.parse("default", fields="metadata.name=x")
    watch = store.watch(pinned, send_initial_events=True)
    assert [e.type for e in watch.open()] == ["ADDED", "BOOKMARK"]
    for _ in range(5):
        assert watch.poll() == []

    source.apply(node("n1", entry("default/other")))
    assert watch.poll() == []
    source.apply(node("a", entry("default/x", "Hibernated")))
    (event,) = watch.poll()
    assert event.type == "MODIFIED"
    source.apply(node("a"))
    assert [e.type for e in watch.poll()] == ["DELETED"]
    source.apply(node("b", entry("default/x", claim_id="sb_elsewhere")))
    assert [e.type for e in watch.poll()] == ["ADDED"]
    # A move by two swaps read one at a time is the sandbox leaving b, then arriving on
    # c. (Two swaps in one burst may be logged by one sync: a MODIFIED onto c.)
    source.apply(node("b"))
    moved = [(e.type, e.object["status"]["nodeName"]) for e in watch.poll()]
    source.apply(node("c", entry("default/x", claim_id="sb_moved")))
    moved += [(e.type, e.object["status"]["nodeName"]) for e in watch.poll()]
    assert moved == [("DELETED", "b"), ("ADDED", "c")]
    assert store.stats.live_asks == {}


def test_a_states_sorted_names_follow_adds_and_removes_without_a_resort(
    clock: ManualClock,
) -> None:
    names = [f"default/s{i:03}" for i in range(100)]
    store, source = _store(clock, node("a", *(entry(n) for n in names)))
    assert store.state().names() == sorted(store.state().held)  # the first: sorted
    rng = random.Random(7)
    for round_ in range(30):
        gone = set(rng.sample(names, 3))
        names = [n for n in names if n not in gone] + [f"team/n{round_}-{i}" for i in range(2)]
        source.apply(node("a", *(entry(n) for n in names)))
        state = store.state()
        if round_ % 3 == 0:  # some states are never listed: the next carries their changes
            assert state.names() == sorted(state.held)
            assert state._origin is None  # it let its origin go
    assert store.state().names() == sorted(store.state().held)

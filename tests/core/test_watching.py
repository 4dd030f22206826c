"""The watch diff (fleet.md 5.5): ADDED, MODIFIED, DELETED, the pinned keep, order, bookmark."""

from __future__ import annotations

from typing import Any

from sandboxctl.core.model import Entry
from sandboxctl.core.sandboxes import sandbox_object
from sandboxctl.core.snapshot import Located
from sandboxctl.core.watching import (
    ADDED,
    BOOKMARK,
    DELETED,
    MODIFIED,
    WatchEvent,
    bookmark,
    diff,
    object_key,
    opening_burst,
)


def obj(
    name: str, phase: str = "Running", node: str = "node-a", claim_id: str = ""
) -> dict[str, Any]:
    return sandbox_object(Located(node, Entry(name=name, phase=phase, id=claim_id)))


def keyed(*objects: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {object_key(o): o for o in objects}


def summary(events: list[WatchEvent]) -> list[tuple[str, str]]:
    return [(e.type, object_key(e.object)) for e in events]


# --- one kind of change at a time ---------------------------------------------------------------


def test_a_new_key_is_added() -> None:
    current = keyed(obj("ns/a"))
    events, known = diff({}, current)
    assert events == [WatchEvent(ADDED, current["ns/a"])]
    assert known == current


def test_a_changed_resource_version_is_modified() -> None:
    before = keyed(obj("ns/a", "Running"))
    after = keyed(obj("ns/a", "Hibernated"))
    events, known = diff(before, after)
    assert events == [WatchEvent(MODIFIED, after["ns/a"])]
    assert known == after


def test_the_same_name_reclaimed_on_the_same_node_is_modified() -> None:
    events, _ = diff(keyed(obj("ns/a", claim_id="sb_1")), keyed(obj("ns/a", claim_id="sb_2")))
    assert summary(events) == [(MODIFIED, "ns/a")]


def test_an_unchanged_object_sends_nothing() -> None:
    state = keyed(obj("ns/a"), obj("ns/b"))
    events, known = diff(state, keyed(obj("ns/a"), obj("ns/b")))
    assert events == []
    assert known == state


def test_an_unchanged_resource_version_sends_nothing_even_if_other_parts_differ() -> None:
    before = keyed(obj("ns/a", node="node-a"))
    after = keyed(obj("ns/a", node="node-b"))  # the node is not hashed into the RV
    events, known = diff(before, after)
    assert events == []
    assert known == after  # known follows current


def test_a_vanished_key_is_deleted_with_the_last_known_object() -> None:
    last = obj("ns/a", "Hibernated")
    events, known = diff({"ns/a": last}, {})
    assert events == [WatchEvent(DELETED, last)]
    assert events[0].object is last
    assert known == {}


def test_empty_to_empty_is_quiet() -> None:
    assert diff({}, {}) == ([], {})


def test_diff_leaves_its_inputs_alone() -> None:
    known = keyed(obj("ns/a"))
    current = keyed(obj("ns/b"))
    known_copy, current_copy = dict(known), dict(current)
    diff(known, current)
    assert (known, current) == (known_copy, current_copy)


# --- the pinned keep ----------------------------------------------------------------------------


def test_keep_suppresses_the_delete_and_keeps_the_object_known() -> None:
    last = obj("ns/a")
    asked: list[tuple[str, dict[str, Any]]] = []

    def held(key: str, last_object: dict[str, Any]) -> bool:
        asked.append((key, last_object))
        return True

    events, known = diff({"ns/a": last}, {}, keep=held)
    assert events == []
    assert known == {"ns/a": last}
    assert asked == [("ns/a", last)]


def test_keep_is_asked_only_about_vanished_keys_and_decides_per_key() -> None:
    before = keyed(obj("ns/stay"), obj("ns/held"), obj("ns/gone"))
    after = keyed(obj("ns/stay"), obj("ns/new"))
    asked: list[str] = []

    def held(key: str, last_object: dict[str, Any]) -> bool:
        asked.append(key)
        return key == "ns/held"

    events, known = diff(before, after, keep=held)
    assert summary(events) == [(ADDED, "ns/new"), (DELETED, "ns/gone")]
    assert sorted(asked) == ["ns/gone", "ns/held"]
    assert set(known) == {"ns/stay", "ns/new", "ns/held"}
    assert known["ns/held"] is before["ns/held"]


def test_a_kept_object_that_comes_back_changed_is_modified() -> None:
    _, known = diff(keyed(obj("ns/a")), {}, keep=lambda key, last: True)
    events, _ = diff(known, keyed(obj("ns/a", "Paused")))
    assert summary(events) == [(MODIFIED, "ns/a")]


def test_moved_to_another_node_across_ticks_is_deleted_then_added() -> None:
    on_a = keyed(obj("ns/a", node="node-a", claim_id="sb_1"))
    gone, known = diff(on_a, {})
    back, _ = diff(known, keyed(obj("ns/a", node="node-b", claim_id="sb_9")))
    assert summary(gone) == [(DELETED, "ns/a")]
    assert summary(back) == [(ADDED, "ns/a")]


# --- order --------------------------------------------------------------------------------------


def test_added_and_modified_come_in_key_order_then_deleted_in_key_order() -> None:
    before = keyed(obj("b/z"), obj("b/y", "Paused"), obj("a/gone"), obj("c/gone"))
    after = keyed(obj("c/new"), obj("b/y"), obj("a/new"), obj("b/z"))
    events, _ = diff(before, after)
    assert summary(events) == [
        (ADDED, "a/new"),
        (MODIFIED, "b/y"),
        (ADDED, "c/new"),
        (DELETED, "a/gone"),
        (DELETED, "c/gone"),
    ]


def test_keys_are_ordered_by_namespace_then_name() -> None:
    # As text "a-b/x" < "a/x"; by (namespace, name) "a" comes before "a-b", as a list sorts.
    events, _ = diff({}, keyed(obj("a-b/x"), obj("a/x")))
    assert summary(events) == [(ADDED, "a/x"), (ADDED, "a-b/x")]


# --- opening burst and bookmark -----------------------------------------------------------------


def test_the_opening_burst_is_one_added_per_object_in_namespace_name_order() -> None:
    objects = [obj("b/a"), obj("a-b/x"), obj("a/z"), obj("a/x"), obj("plain")]
    events = opening_burst(objects)
    assert [e.type for e in events] == [ADDED] * 5
    assert summary(events) == [
        (ADDED, "a/x"),
        (ADDED, "a/z"),
        (ADDED, "a-b/x"),
        (ADDED, "b/a"),
        (ADDED, "default/plain"),
    ]


def test_the_opening_burst_of_nothing_is_empty() -> None:
    assert opening_burst([]) == []


def test_a_burst_then_an_identical_poll_is_quiet() -> None:
    objects = [obj("ns/a"), obj("ns/b")]
    burst = opening_burst(objects)
    known = {object_key(e.object): e.object for e in burst}
    assert diff(known, keyed(obj("ns/b"), obj("ns/a"))) == ([], known)


def test_the_bookmark_shape() -> None:
    event = bookmark("12345")
    assert event.type == BOOKMARK
    assert event.to_json() == {
        "type": "BOOKMARK",
        "object": {
            "kind": "Sandbox",
            "apiVersion": "agents.x-k8s.io/v1beta1",
            "metadata": {
                "resourceVersion": "12345",
                "annotations": {"k8s.io/initial-events-end": "true"},
            },
        },
    }


def test_to_json_wraps_type_and_object() -> None:
    o = obj("ns/a")
    assert WatchEvent(ADDED, o).to_json() == {"type": "ADDED", "object": o}


def test_object_key_defaults_the_namespace() -> None:
    assert object_key({"metadata": {"name": "x"}}) == "default/x"
    assert object_key(obj("ns/a")) == "ns/a"

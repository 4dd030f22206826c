"""The shape of watch events and bookmarks."""

from __future__ import annotations

from sandboxctl.core.sandboxes import API_VERSION, KIND
from sandboxctl.core.watching import BOOKMARK, INITIAL_EVENTS_END, WatchEvent, bookmark


def test_a_progress_bookmark_carries_only_the_version() -> None:
    event = bookmark("42")
    assert event.type == BOOKMARK
    assert event.object == {
        "kind": KIND,
        "apiVersion": API_VERSION,
        "metadata": {"resourceVersion": "42"},
    }


def test_the_initial_events_end_bookmark_is_annotated() -> None:
    event = bookmark("42", initial_events_end=True)
    assert event.object["metadata"] == {
        "resourceVersion": "42",
        "annotations": {INITIAL_EVENTS_END: "true"},
    }


def test_to_json_wraps_type_and_object() -> None:
    event = WatchEvent("ADDED", {"metadata": {"name": "x"}})
    assert event.to_json() == {"type": "ADDED", "object": {"metadata": {"name": "x"}}}

"""A watch response's body read into events: lines split across any segments, each event
parsed once, what msgspec refuses read by json, and a cut last line left for the re-watch."""

from __future__ import annotations

import json
import math

import pytest

from sandboxctl.kube.resources import watch_event, watch_lines

EVENTS = [
    {"type": "ADDED", "object": {"metadata": {"name": "n1", "resourceVersion": "7"}}},
    {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "8"}}},
    {"type": "MODIFIED", "object": {"metadata": {"name": "n1"}, "entries": ["é" * 50]}},
]
BODY = b"".join(json.dumps(e).encode() + b"\n" for e in EVENTS)


@pytest.mark.parametrize("size", [1, 2, 7, 64, len(BODY)])
def test_lines_are_the_same_however_the_body_is_cut(size: int) -> None:
    segments = [BODY[i : i + size] for i in range(0, len(BODY), size)]
    assert [watch_event(line) for line in watch_lines(segments)] == EVENTS


def test_several_lines_in_one_segment_and_empty_lines_between() -> None:
    assert list(watch_lines([b"a\n\nb\nc", b"d\n"])) == [b"a", b"", b"b", b"cd"]


def test_a_last_line_without_its_newline_is_not_an_event() -> None:
    assert list(watch_lines([b'{"type": "ADDED"}\n{"type": "MOD'])) == [b'{"type": "ADDED"}']


def test_what_msgspec_refuses_is_read_by_json() -> None:
    assert watch_event(b'{"type": "ADDED", "object": {"n": 1e400}}')["object"]["n"] == math.inf
    replaced = watch_event(b'{"type": "ADDED", "object": {"s": "a\xffb"}}')
    assert replaced["object"]["s"] == "a\ufffdb"  # invalid UTF-8 replaced, as the client does


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (b"[1, 2]", "must be a JSON object"),
        (b"not json", "Expecting value"),
        (b'{"a": ', "Expecting value"),
    ],
)
def test_a_line_that_is_not_an_event_object_is_a_value_error(line: bytes, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        watch_event(line)

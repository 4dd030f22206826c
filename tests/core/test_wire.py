"""The one wire layer: decoding into shapes, the rules every shape shares (null as absent,
an empty time as none), errors naming the field in this project's words, and the bytes
every API answers."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Annotated, Any

import msgspec
import pytest

from sandboxctl.core import wire
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.timestamps import ZonedTime
from sandboxctl.core.wire import Count, Model, NonEmpty, NotJson, WireError

T0 = datetime(2026, 11, 30, 4, 0, tzinfo=UTC)


class Key(Model, frozen=True):
    template: NonEmpty
    net: str = ""


class Shape(Model, frozen=True, forbid_unknown_fields=True):
    ROOT = "shape"

    key: Key
    warm: Count
    when: ZonedTime | None = None
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    names: tuple[NonEmpty, ...] = ()
    ratio: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    limit: Annotated[int, msgspec.Meta(ge=1, le=10)] | None = None

    def __post_init__(self) -> None:
        if self.warm == 99:
            raise InvalidValueError("warm: 99 is not allowed here")


def problem(data: object) -> tuple[str, str]:
    with pytest.raises(WireError) as raised:
        Shape.from_json(data)
    return raised.value.field, raised.value.problem


def test_bytes_text_and_plain_values_read_the_same() -> None:
    body = {"key": {"template": "base"}, "warm": 2, "when": "2026-11-30T06:00:00+02:00"}
    from_bytes = Shape.from_json(json.dumps(body).encode())
    assert from_bytes == Shape.from_json(json.dumps(body)) == Shape.from_json(body)
    assert from_bytes.when == T0


def test_a_null_is_the_field_left_out_and_an_empty_time_is_none() -> None:
    read = Shape.from_json({"key": {"template": "b", "net": None}, "warm": 1, "labels": None})
    assert (read.key.net, read.labels) == ("", {})
    assert Shape.from_json({"key": {"template": "b"}, "warm": 1, "when": ""}).when is None
    # ...but a null where a value is required is a required value missing
    assert problem({"key": {"template": "b"}, "warm": None}) == ("shape.warm", "required")
    # ...and a null inside a mapping is a value of the wrong kind
    assert problem({"key": {"template": "b"}, "warm": 1, "labels": {"a": None}}) == (
        "shape.labels.a",
        "expected a string, got null",
    )


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ([], "shape", "expected an object, got list"),
        (None, "shape", "expected an object, got null"),
        ({"warm": 1}, "shape.key", "expected an object, got null"),
        ({"key": {"template": ""}, "warm": 1}, "shape.key.template", "required"),
        ({"key": {"template": "b"}}, "shape.warm", "required"),
        ({"key": {"template": "b"}, "warm": "1"}, "shape.warm", "expected an integer, got str"),
        ({"key": {"template": "b"}, "warm": True}, "shape.warm", "expected an integer, got bool"),
        ({"key": {"template": "b"}, "warm": -3}, "shape.warm", "must not be negative, got -3"),
        ({"key": {"template": "b"}, "warm": 1, "x": 1}, "shape.x", "unknown field"),
        ({"key": {"template": "b"}, "warm": 1, "ratio": "x"}, "shape.ratio",
         "expected a number, got str"),
        ({"key": {"template": "b"}, "warm": 1, "limit": 0}, "shape.limit",
         "must be at least 1, got 0"),
        ({"key": {"template": "b"}, "warm": 1, "limit": 11}, "shape.limit",
         "must be at most 10, got 11"),
        ({"key": {"template": "b"}, "warm": 1, "names": ["a", ""]}, "shape.names[1]", "required"),
        ({"key": {"template": "b"}, "warm": 1, "labels": []}, "shape.labels",
         "expected an object, got list"),
        ({"key": {"template": "b"}, "warm": 1, "when": "soon"}, "shape.when",
         "invalid timestamp 'soon': expected RFC 3339"),
        ({"key": {"template": "b"}, "warm": 1, "when": "2026-11-30T04:00:00"}, "shape.when",
         "invalid timestamp '2026-11-30T04:00:00': RFC 3339 needs a zone such as Z"),
        ({"key": {"template": "b"}, "warm": 1, "when": 5}, "shape.when",
         "expected an RFC 3339 time, got int"),
        ({"key": {"template": "b"}, "warm": 99}, "shape.warm", "99 is not allowed here"),
    ],
)  # fmt: skip
def test_what_does_not_fit_is_named_in_plain_words(data: object, field: str, words: str) -> None:
    assert problem(data) == (field, words)


def test_the_key_of_a_bad_mapping_value_is_named_and_no_value_is_repeated() -> None:
    field, words = problem({"key": {"template": "b"}, "warm": 1, "labels": {"ok": "x", "k": 7}})
    assert (field, words) == ("shape.labels.k", "expected a string, got int")
    with pytest.raises(WireError) as raised:
        Shape.from_json({"key": {"template": "b"}, "warm": 1, "labels": {"TOKEN": ["hunter2"]}})
    assert "hunter2" not in str(raised.value)


def test_bytes_that_are_not_json_are_not_json() -> None:
    for raw in (b"{not json", b"", b"[" * 100_000 + b"]" * 100_000):
        with pytest.raises(NotJson):
            wire.decode(dict[str, Any], raw)
    assert issubclass(NotJson, WireError)
    assert issubclass(WireError, InvalidValueError)  # a 400 on every API


def test_encode_writes_what_pythons_writer_writes_with_times_at_second_precision() -> None:
    at = datetime(2026, 11, 30, 6, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    shape = Shape(Key("base"), 2, when=at, labels={"ü": "ß"}, ratio=1e-05)
    written = wire.encode(shape)
    assert (
        written
        == json.dumps(
            {
                "key": {"template": "base", "net": ""},
                "warm": 2,
                "when": "2026-11-30T04:00:00Z",
                "labels": {"ü": "ß"},
                "names": [],
                "ratio": 1e-05,
                "limit": None,
            },
            ensure_ascii=False,
            separators=(",", ":"),
        ).encode()
    )
    assert wire.plain([shape])[0]["when"] == "2026-11-30T04:00:00Z"


def test_a_field_left_unset_is_not_written() -> None:
    class Sparse(Model, frozen=True):
        given: int
        maybe: str | msgspec.UnsetType = msgspec.UNSET

    assert wire.encode(Sparse(1)) == b'{"given":1}'
    assert wire.encode(Sparse(1, "x")) == b'{"given":1,"maybe":"x"}'

"""The kube source's reading of watch events, line by line as its informer hands them
over: each entry kept as its JSON, an entry whose bytes did not change is the entry the
node holds, only the others decoded; forms the wire's rules refuse are read as the
object reader reads them, and an entry that breaks a rule leaves the node as it was."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from kubernetes import client

from sandboxctl.core.model import Entry, Metadata, inventory_from_object
from sandboxctl.inventory.kube import KubeInventorySource, inventory_event

T0 = "2026-11-30T04:00:00Z"


def entry(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "phase": "Running", "id": f"sb_{name}", **fields}


def line(kind: str, *entries: dict[str, Any], stamp: str = T0) -> bytes:
    obj = {
        "apiVersion": "sandbox.cocoonstack.io/v1beta1",
        "kind": "NodeInventory",
        "metadata": {"name": "n1", "resourceVersion": "7"},
        "node": "n1",
        "address": "n1.invalid:7777",
        "entries": list(entries),
        "publishedAt": stamp,
    }
    return json.dumps({"type": kind, "object": obj}).encode()


@pytest.fixture
def source() -> KubeInventorySource:
    configuration = client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # never called: events are handed in
    return KubeInventorySource(client.ApiClient(configuration))


def feed(source: KubeInventorySource, raw: bytes) -> tuple[Entry, ...]:
    event = inventory_event(raw)
    source.on_event(event["type"], event["object"])
    record = source.snapshot().record("n1")
    assert record is not None
    return record.inventory.entries


def test_entries_stay_json_until_read_and_the_rest_of_the_event_is_the_object() -> None:
    event = inventory_event(line("ADDED", entry("a")))
    assert event["type"] == "ADDED"
    obj = event["object"]
    assert obj["metadata"] == {"name": "n1", "resourceVersion": "7"}
    assert obj["publishedAt"] == T0
    (raw,) = obj["entries"]
    assert isinstance(raw, msgspec.Raw)
    assert msgspec.json.decode(raw) == entry("a")
    assert "pools" not in obj  # what the object lacks stays absent


def test_an_error_event_is_read_whole() -> None:
    status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    event = inventory_event(json.dumps({"type": "ERROR", "object": status}).encode())
    assert event == {"type": "ERROR", "object": status}


def test_a_republish_keeps_each_entry_whose_bytes_did_not_change(
    source: KubeInventorySource,
) -> None:
    first = feed(source, line("ADDED", entry("a"), entry("b"), entry("c")))
    # b changed; d is new and put first, so a and c moved: matched by name.
    again = feed(
        source, line("MODIFIED", entry("d"), entry("a"), entry("b", phase="Paused"), entry("c"))
    )
    assert [e.name for e in again] == ["d", "a", "b", "c"]
    assert again[1] is first[0]
    assert again[3] is first[2]
    assert again[2].phase == "Paused"
    assert again[2] is not first[1]
    # The same bytes at the same place: the very entries the node holds.
    same = feed(
        source, line("MODIFIED", entry("d"), entry("a"), entry("b", phase="Paused"), entry("c"))
    )
    assert all(map(lambda x, y: x is y, same, again))


def test_an_entry_equal_in_value_but_not_in_bytes_is_reused(source: KubeInventorySource) -> None:
    first = feed(source, line("ADDED", entry("a", deadline="2026-11-30T05:00:00Z")))
    later = feed(source, line("MODIFIED", entry("a", deadline="2026-11-30T07:00:00+02:00")))
    assert later[0] is first[0]


def test_times_are_read_in_utc_whatever_their_offset(source: KubeInventorySource) -> None:
    (read,) = feed(source, line("ADDED", entry("a", deadline="2026-11-30T07:00:00+02:00")))
    assert read.deadline == datetime(2026, 11, 30, 5, 0, tzinfo=UTC)
    assert read.deadline.tzinfo is UTC
    (again,) = feed(source, line("MODIFIED", entry("a", claimedAt="2026-11-30T06:00:00+02:00")))
    assert again.claimed_at is not None
    assert again.claimed_at.tzinfo is UTC


def test_forms_the_wire_refuses_are_read_as_the_object_reader_reads_them(
    source: KubeInventorySource,
) -> None:
    feed(source, line("ADDED", entry("a")))
    tolerated = entry("b", id=None, metadata={"z": 1, "a": 2}, deadline="")
    read = feed(source, line("MODIFIED", entry("a"), tolerated))
    assert read[1] == Entry(name="b", phase="Running", metadata=Metadata.parse('{"a":2,"z":1}'))
    assert read[1].id == ""
    assert read[1].deadline is None


def test_an_entry_that_breaks_a_rule_leaves_the_node_as_it_was(
    source: KubeInventorySource, caplog: pytest.LogCaptureFixture
) -> None:
    held = feed(source, line("ADDED", entry("a")))
    with caplog.at_level(logging.WARNING):
        after = feed(source, line("MODIFIED", entry("a"), entry("b", cpuCount=-1)))
    assert after is held
    assert "entries[1].cpuCount" in caplog.text
    # Fixed, it is read again, and the entry it kept is still reused.
    fixed = feed(source, line("MODIFIED", entry("a"), entry("b", cpuCount=1)))
    assert fixed[0] is held[0]
    assert fixed[1].cpu_count == 1


def test_what_the_wire_cannot_decode_is_read_as_any_object_is(
    source: KubeInventorySource, caplog: pytest.LogCaptureFixture
) -> None:
    feed(source, line("ADDED", entry("a")))
    # Invalid UTF-8 inside an entry: replaced, as the client replaces it.
    broken = line("MODIFIED", entry("a"), entry("b", template="t")).replace(b'"t"', b'"\xff"')
    read = feed(source, broken)
    assert read[1].template == "\ufffd"
    # A number beyond a double, and a time beyond the calendar in UTC: unreadable, named.
    for field, beyond in (
        ("entries[1].cpuCount", entry("b", cpuCount="HUGE")),
        ("entries[1].deadline", entry("b", deadline="0001-01-01T00:00:00+01:00")),
    ):
        held = feed(source, line("MODIFIED", entry("a")))  # readable: the next is logged
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            bad = line("MODIFIED", entry("a"), beyond).replace(b'"HUGE"', b"1e400")
            assert feed(source, bad) is held
        assert field in caplog.text


def test_times_read_the_same_as_the_plain_reader_reads_them(source: KubeInventorySource) -> None:
    times = ["2026-11-30T04:00:00.123456789Z", "2026-11-30t04:00:00.9999999z"]
    entries = [entry(f"e{i}", deadline=t) for i, t in enumerate(times)]
    listed = inventory_from_object(json.loads(line("ADDED", *entries))["object"]).entries
    feed(source, line("ADDED", entry("x")))
    watched = feed(source, line("MODIFIED", *entries))
    assert [e.deadline for e in watched] == [e.deadline for e in listed]
    assert listed[1].deadline == datetime(2026, 11, 30, 4, 0, 1, tzinfo=UTC)


def test_a_relisted_object_then_its_next_event(source: KubeInventorySource) -> None:
    # A relist hands over plain JSON; the watch after it reuses what that read, by name.
    obj = json.loads(line("ADDED", entry("a"), entry("b"), entry("c")))["object"]
    source.on_event("MODIFIED", obj)
    listed = source.snapshot().record("n1").inventory.entries  # type: ignore[union-attr]
    shrunk = feed(source, line("MODIFIED", entry("c"), entry("a")))
    assert shrunk[0] is listed[2]
    assert shrunk[1] is listed[0]
    source.on_event("DELETED", obj)
    assert source.snapshot().record("n1") is None
    again = feed(source, line("ADDED", entry("c"), entry("a")))
    assert [e.name for e in again] == ["c", "a"]


def test_each_event_notifies_the_subscribers_after_the_swap(source: KubeInventorySource) -> None:
    seen: list[tuple[str, ...]] = []
    source.subscribe(lambda: seen.append(source.snapshot().nodes))
    feed(source, line("ADDED", entry("a")))
    event = inventory_event(line("DELETED", entry("a")))
    source.on_event(event["type"], event["object"])
    assert seen == [("n1",), ()]

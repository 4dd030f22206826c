"""The shared answer -> inventory mapping, on plain dict answers shaped like the agent's,
read through the models as the client reads them."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from sandboxctl.agentapi import (
    AgentAnswerError,
    AgentInfo,
    SandboxList,
    SandboxRow,
    inventory_from_agent,
    pools_from_info,
)
from sandboxctl.agentapi import entry_from_row as entry_of
from sandboxctl.core.errors import InvalidValueError, SandboxctlError
from sandboxctl.core.model import (
    NO_METADATA,
    Entry,
    Metadata,
    Pool,
    PoolKey,
    inventory_from_object,
    inventory_to_object,
)
from sandboxctl.core.wire import WireError

T0 = datetime(2026, 11, 30, 4, 0, tzinfo=UTC)


def _row(**fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": "sb_0001",
        "key": {"template": "base", "net": "none", "size": "small"},
        "deadline": "2026-11-30T04:05:00Z",
        "claimed_at": "2026-11-30T04:00:00Z",
        "hibernated": False,
        "claim_ref": "team/a",
        "metadata": {"owner": "x"},
        "cpu_count": 1,
        "mem_total_bytes": 512 << 20,
    }
    row.update(fields)
    return row


def entry_from_row(row: Any) -> Entry:
    return entry_of(SandboxRow.from_json(row))


def _inventory(info: Any, rows: Any, published_at: datetime) -> Any:
    listed = SandboxList.from_json({"sandboxes": rows}).sandboxes
    return inventory_from_agent(AgentInfo.from_json(info), listed, published_at)


def _info(**fields: Any) -> dict[str, Any]:
    info: dict[str, Any] = {
        "node": "node-a",
        "advertise_addr": "10.0.0.1:7777",
        "pools": [
            {
                "key": {"template": "base", "net": "none", "size": "small"},
                "warm": 2,
                "target": 3,
                "refilling": 1,
            },
            {"key": {"template": "py"}, "warm": 0, "target": 1},
        ],
        "claimed": 1,
        "capacity": 64,
    }
    info.update(fields)
    return info


def test_a_full_row_maps_every_field() -> None:
    assert entry_from_row(_row()) == Entry(
        name="team/a",
        phase="Running",
        id="sb_0001",
        template="base",
        claim_ref="team/a",
        deadline=datetime(2026, 11, 30, 4, 5, tzinfo=UTC),
        claimed_at=T0,
        metadata=Metadata.parse('{"owner":"x"}'),
        cpu_count=1,
        memory_bytes=512 << 20,
    )


def test_an_empty_claim_ref_names_the_entry_by_its_id() -> None:
    for empty in ("", None):
        entry = entry_from_row(_row(claim_ref=empty))
        assert (entry.name, entry.claim_ref, entry.id) == ("sb_0001", "sb_0001", "sb_0001")
        assert entry.namespaced_name == ("default", "sb_0001")
    bare = entry_from_row({"id": "sb_2", "key": {"template": "base"}})
    assert (bare.name, bare.claim_ref) == ("sb_2", "sb_2")


def test_hibernated_or_archived_rows_are_hibernated() -> None:
    assert entry_from_row(_row(hibernated=True)).phase == "Hibernated"
    assert entry_from_row(_row(hibernated=False, archived=True)).phase == "Hibernated"
    assert entry_from_row(_row(hibernated=False)).phase == "Running"
    assert entry_from_row(_row(hibernated=None)).phase == "Running"


def test_metadata_is_the_rows_own_and_deterministic_json_when_written() -> None:
    one = entry_from_row(_row(metadata={"b": "2", "a": "1", "ü": "ß"}))
    other = entry_from_row(_row(metadata={"ü": "ß", "a": "1", "b": "2"}))
    assert one.metadata == other.metadata
    assert dict(one.metadata) == {"a": "1", "b": "2", "ü": "ß"}
    assert one.metadata.text == json.dumps(
        {"a": "1", "b": "2", "ü": "ß"}, sort_keys=True, separators=(",", ":")
    )
    assert " " not in one.metadata.text
    for empty in ({}, None):
        assert entry_from_row(_row(metadata=empty)).metadata is NO_METADATA
    row = _row()
    del row["metadata"]
    assert entry_from_row(row).metadata is NO_METADATA


def test_missing_times_and_go_zero_times_are_omitted() -> None:
    entry = entry_from_row(_row(deadline=None, claimed_at="0001-01-01T00:00:00Z"))
    assert (entry.deadline, entry.claimed_at) == (None, None)
    row = _row()
    for key in ("deadline", "claimed_at", "cpu_count", "mem_total_bytes"):
        del row[key]
    entry = entry_from_row(row)
    assert (entry.deadline, entry.claimed_at, entry.cpu_count, entry.memory_bytes) == (
        None,
        None,
        None,
        None,
    )


def test_times_with_an_offset_are_read_as_utc() -> None:
    entry = entry_from_row(_row(deadline="2026-11-30T06:05:00+02:00"))
    assert entry.deadline == datetime(2026, 11, 30, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    ("change", "field", "problem"),
    [
        ({"id": ""}, "id", "required"),
        ({"id": 7}, "id", "expected a string, got int"),
        ({"key": None}, "key", "expected an object, got null"),
        ({"key": {"net": "none"}}, "key.template", "required"),
        ({"claim_ref": ["a"]}, "claim_ref", "expected a string, got list"),
        ({"hibernated": "yes"}, "hibernated", "expected true or false, got str"),
        ({"deadline": "tomorrow"}, "deadline", "invalid timestamp 'tomorrow': expected RFC 3339"),
        ({"claimed_at": 1700000000}, "claimed_at", "expected an RFC 3339 time, got int"),
        ({"metadata": "a=b"}, "metadata", "expected an object, got str"),
        ({"cpu_count": True}, "cpu_count", "expected an integer, got bool"),
        ({"mem_total_bytes": -1}, "mem_total_bytes", "must not be negative, got -1"),
    ],
)
def test_a_bad_row_names_the_field(change: dict[str, Any], field: str, problem: str) -> None:
    with pytest.raises(WireError) as error:
        entry_from_row(_row(**change))
    assert (error.value.field, error.value.problem) == (field, problem)
    assert str(error.value) == f"{field}: {problem}"
    assert isinstance(error.value, SandboxctlError)


def test_a_row_that_is_not_an_object_fails() -> None:
    with pytest.raises(WireError, match="expected an object, got list"):
        entry_from_row([])  # type: ignore[arg-type]


def test_pools_come_from_the_info_key_with_defaults() -> None:
    assert pools_from_info(AgentInfo.from_json(_info())) == (
        Pool(PoolKey("base", "none", "small"), warm=2, target=3),
        Pool(PoolKey("py", "none", "small"), warm=0, target=1),
    )
    assert pools_from_info(AgentInfo.from_json(_info(pools=[]))) == ()
    assert pools_from_info(AgentInfo.from_json({"node": "n"})) == ()


@pytest.mark.parametrize(
    ("pools", "field", "problem"),
    [
        ({"key": "base"}, "info.pools", "expected a list, got dict"),
        ([{"warm": 1, "target": 1}], "info.pools[0].key", "expected an object, got null"),
        (
            [{"key": {"template": ""}, "warm": 1, "target": 1}],
            "info.pools[0].key.template",
            "required",
        ),
        ([{"key": {"template": "b"}, "target": 1}], "info.pools[0].warm", "required"),
        (
            [{"key": {"template": "b"}, "warm": 1, "target": "2"}],
            "info.pools[0].target",
            "expected an integer, got str",
        ),
    ],
)
def test_bad_pools_name_the_field(pools: Any, field: str, problem: str) -> None:
    with pytest.raises(WireError) as error:
        pools_from_info(AgentInfo.from_json(_info(pools=pools)))
    assert (error.value.field, error.value.problem) == (field, problem)


def test_an_inventory_from_an_agent_sorts_entries_and_takes_the_callers_stamp() -> None:
    rows = [
        _row(id="sb_3", claim_ref="team/c"),
        _row(id="sb_1", claim_ref=""),
        _row(id="sb_2", claim_ref="team/a", hibernated=True),
        _row(id="sb_0", claim_ref="team/a"),
    ]
    inventory = _inventory(_info(), rows, published_at=T0)
    assert inventory.node == "node-a"
    assert inventory.address == "10.0.0.1:7777"
    assert inventory.published_at == T0
    assert [p.key for p in inventory.pools] == [PoolKey("base"), PoolKey("py")]
    assert [(e.name, e.id, e.phase) for e in inventory.entries] == [
        ("sb_1", "sb_1", "Running"),
        ("team/a", "sb_0", "Running"),
        ("team/a", "sb_2", "Hibernated"),
        ("team/c", "sb_3", "Running"),
    ]
    # The same rows in another order make the same inventory.
    assert _inventory(_info(), rows[::-1], published_at=T0) == inventory
    # And it survives the NodeInventory object shape unchanged.
    assert inventory_from_object(inventory_to_object(inventory)) == inventory


def test_an_agent_with_no_sandboxes_is_an_empty_node() -> None:
    inventory = _inventory(_info(pools=None), [], published_at=T0)
    assert (inventory.node, inventory.pools, inventory.entries) == ("node-a", (), ())


@pytest.mark.parametrize(
    ("info", "rows", "field", "problem"),
    [
        (None, [], "info", "expected an object, got null"),
        (_info(node=None), [], "info.node", "required"),
        (_info(node=3), [], "info.node", "expected a string, got int"),
        (_info(advertise_addr=""), [], "info.advertise_addr", "required"),
        (_info(advertise_addr=None), [], "info.advertise_addr", "required"),
        (_info(), {"rows": []}, "sandboxes", "expected a list, got dict"),
        (_info(), "rows", "sandboxes", "expected a list, got str"),
        (_info(), [_row(), _row(key={})], "sandboxes[1].key.template", "required"),
        (_info(), [_row(), 5], "sandboxes[1]", "expected an object, got int"),
    ],
)
def test_a_bad_agent_answer_names_the_field(info: Any, rows: Any, field: str, problem: str) -> None:
    # The shapes name the field (the client adds which agent); the mapping, what the
    # inventory needs beyond them (an address).
    with pytest.raises((WireError, AgentAnswerError)) as error:
        _inventory(info, rows, published_at=T0)
    assert (error.value.field, error.value.problem) == (field, problem)


def test_an_answer_error_can_name_the_agent() -> None:
    error = AgentAnswerError("info.node", "required").at("10.0.0.1:7777")
    assert str(error) == "sandboxd 10.0.0.1:7777: info.node: required"
    assert (error.field, error.address) == ("info.node", "10.0.0.1:7777")


def test_the_stamp_must_carry_a_zone() -> None:
    with pytest.raises(InvalidValueError, match="zone"):
        _inventory(_info(), [], published_at=datetime(2026, 11, 30, 4, 0))

"""The NodeInventory object shape: reading, writing and refusing."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

import pytest
import yaml

from sandboxctl.core.errors import InventoryFormatError
from sandboxctl.core.model import (
    API_VERSION,
    KIND,
    Entry,
    Metadata,
    NodeInventory,
    Pool,
    PoolKey,
    inventory_from_object,
    inventory_to_object,
    split_name,
)

NINE_UTC = datetime(2026, 9, 27, 9, 0, tzinfo=UTC)


def full_object() -> dict:
    """Every field of the shape, as a publisher writes it (net/size given on one pool only)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "node-a", "labels": {"zone": "z1"}},
        "node": "node-a",
        "address": "10.0.0.7:7777",
        "pools": [
            {"template": "python", "net": "bridge", "size": "large", "warm": 2, "target": 4},
            {"template": "node", "warm": 0, "target": 1},
        ],
        "templates": [
            {
                "template": "python",
                "net": "bridge",
                "size": "large",
                "contentDigest": "sha256:abc",
                "tenant": "t1",
                "createdAt": "2026-09-01T00:00:00Z",
                "cpuCount": 2,
                "memoryBytes": 1073741824,
                "labels": {"team": "ml"},
            }
        ],
        "entries": [
            {
                "name": "team/notebook",
                "id": "sb_01",
                "phase": "Running",
                "template": "python",
                "claimRef": "team/claim-1",
                "addr": "10.0.0.7:49983",
                "deadline": "2026-09-27T10:00:00Z",
                "claimedAt": "2026-09-27T08:00:00Z",
                "metadata": '{"owner":"ann"}',
                "cpuCount": 2,
                "memoryBytes": 536870912,
            },
            {"name": "scratch", "phase": "Hibernated"},
        ],
        "publishedAt": "2026-09-27T09:00:00Z",
    }


def field_error(obj: object) -> InventoryFormatError:
    with pytest.raises(InventoryFormatError) as caught:
        inventory_from_object(obj)
    return caught.value


# --- reading ------------------------------------------------------------------------------


def test_full_object_reads_every_field():
    inventory = inventory_from_object(full_object())
    assert inventory.node == "node-a"
    assert inventory.address == "10.0.0.7:7777"
    assert inventory.pools == (
        Pool(PoolKey("python", "bridge", "large"), warm=2, target=4),
        Pool(PoolKey("node", "none", "small"), warm=0, target=1),
    )
    assert inventory.templates[0]["contentDigest"] == "sha256:abc"
    first, second = inventory.entries
    assert first == Entry(
        name="team/notebook",
        phase="Running",
        id="sb_01",
        template="python",
        claim_ref="team/claim-1",
        addr="10.0.0.7:49983",
        deadline=datetime(2026, 9, 27, 10, 0, tzinfo=UTC),
        claimed_at=datetime(2026, 9, 27, 8, 0, tzinfo=UTC),
        metadata=Metadata.parse('{"owner":"ann"}'),
        cpu_count=2,
        memory_bytes=536870912,
    )
    assert second == Entry(name="scratch", phase="Hibernated")
    assert inventory.published_at == NINE_UTC


def test_full_object_round_trips_with_pool_defaults_filled_in():
    obj = full_object()
    expected = copy.deepcopy(obj)
    expected["pools"][1].update(net="none", size="small")
    assert inventory_to_object(inventory_from_object(obj)) == expected


def test_inventory_round_trips_through_the_object_shape():
    inventory = inventory_from_object(full_object())
    again = inventory_from_object(inventory_to_object(inventory))
    assert again == inventory
    assert again.extra == inventory.extra


def test_writing_omits_empty_optional_fields_and_normalises_times_to_utc():
    obj = {
        "node": "n1",
        "entries": [{"name": "a", "phase": "Running", "deadline": "2026-09-27T11:00:00+02:00"}],
    }
    assert inventory_to_object(inventory_from_object(obj)) == {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "n1"},
        "node": "n1",
        "pools": [],
        "entries": [{"name": "a", "phase": "Running", "deadline": "2026-09-27T09:00:00Z"}],
    }


def test_entry_metadata_given_as_an_object_becomes_a_deterministic_json_string():
    obj = {
        "node": "n1",
        "entries": [{"name": "a", "phase": "Running", "metadata": {"b": 1, "a": [2]}}],
    }
    metadata = inventory_from_object(obj).entries[0].metadata
    assert metadata.text == '{"a":[2],"b":1}'
    assert dict(metadata) == {"a": "[2]", "b": "1"}  # values not strings read as their JSON


def test_missing_lists_read_as_empty():
    inventory = inventory_from_object({"node": "n1"})
    assert (inventory.pools, inventory.templates, inventory.entries) == ((), (), ())
    assert inventory.address == ""


def test_metadata_name_alone_is_accepted_as_the_node():
    assert inventory_from_object({"metadata": {"name": "n1"}}).node == "n1"


def test_node_equal_to_metadata_name_is_accepted():
    assert inventory_from_object({"metadata": {"name": "n1"}, "node": "n1"}).node == "n1"


def test_missing_kind_is_accepted_as_node_inventory():
    assert inventory_from_object({"node": "n1"}).node == "n1"


# --- publishedAt ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stamp",
    [None, "", "not a time", "2026-09-27T09:00:00", 17],
    ids=["null", "empty", "unparsable", "no-zone", "number"],
)
def test_bad_or_empty_published_at_reads_as_unstamped(stamp):
    assert inventory_from_object({"node": "n1", "publishedAt": stamp}).published_at is None


def test_missing_published_at_reads_as_unstamped():
    assert inventory_from_object({"node": "n1"}).published_at is None


def test_published_at_with_an_offset_is_normalised_to_utc():
    obj = {"node": "n1", "publishedAt": "2026-09-27T11:00:00+02:00"}
    assert inventory_from_object(obj).published_at == NINE_UTC


def test_unstamped_inventory_writes_no_published_at():
    assert "publishedAt" not in inventory_to_object(NodeInventory(node="n1"))


def test_published_at_read_from_yaml_as_a_datetime_is_a_stamp():
    # PyYAML turns an unquoted timestamp into a datetime; entries' deadline/claimedAt accept
    # that, and publishedAt must too, or the node silently becomes unstamped (always fresh).
    obj = yaml.safe_load("node: n1\npublishedAt: 2026-09-27T09:00:00Z\n")
    assert isinstance(obj["publishedAt"], datetime)
    assert inventory_from_object(obj).published_at == NINE_UTC


def test_deadline_read_from_yaml_as_a_datetime_is_a_time():
    obj = yaml.safe_load(
        "node: n1\nentries:\n- name: a\n  phase: Running\n  deadline: 2026-09-27T09:00:00Z\n"
    )
    assert inventory_from_object(obj).entries[0].deadline == NINE_UTC


# --- refusing malformed objects --------------------------------------------------------------


def with_entries(*entries: object) -> dict:
    return {"node": "n1", "entries": list(entries)}


def with_pool(**fields: object) -> dict:
    pool = {"template": "python", "warm": 1, "target": 2}
    pool.update(fields)
    return {"node": "n1", "pools": [pool]}


def test_entry_without_phase_names_its_index():
    error = field_error(with_entries({"name": "a", "phase": "Running"}, {"name": "b"}))
    assert error.field == "entries[1].phase"
    assert error.problem == "required"


def test_entry_with_empty_name_is_refused():
    assert field_error(with_entries({"name": "", "phase": "Running"})).field == "entries[0].name"


def test_entry_that_is_not_an_object_is_refused():
    assert field_error(with_entries("a")).field == "entries[0]"


def test_warm_that_is_a_string_is_refused():
    error = field_error(with_pool(warm="3"))
    assert error.field == "pools[0].warm"
    assert "integer" in error.problem


def test_warm_that_is_a_bool_is_refused():
    error = field_error(with_pool(warm=True))
    assert error.field == "pools[0].warm"
    assert "integer" in error.problem


def test_warm_that_is_a_float_is_refused():
    assert field_error(with_pool(warm=1.0)).field == "pools[0].warm"


def test_negative_warm_is_refused():
    error = field_error(with_pool(warm=-1))
    assert error.field == "pools[0].warm"
    assert "negative" in error.problem


def test_missing_warm_is_refused():
    pool = {"template": "python", "target": 2}
    error = field_error({"node": "n1", "pools": [pool]})
    assert (error.field, error.problem) == ("pools[0].warm", "required")


def test_missing_target_is_refused():
    pool = {"template": "python", "warm": 2}
    assert field_error({"node": "n1", "pools": [pool]}).field == "pools[0].target"


def test_pool_without_template_is_refused():
    assert field_error(with_pool(template=None)).field == "pools[0].template"


def test_pool_net_that_is_not_a_string_is_refused():
    assert field_error(with_pool(net=3)).field == "pools[0].net"


def test_deadline_that_is_not_a_time_is_refused():
    error = field_error(with_entries({"name": "a", "phase": "Running", "deadline": "not a time"}))
    assert error.field == "entries[0].deadline"
    assert "not a time" in str(error)


def test_deadline_without_a_zone_is_refused():
    entry = {"name": "a", "phase": "Running", "claimedAt": "2026-09-27T09:00:00"}
    assert field_error(with_entries(entry)).field == "entries[0].claimedAt"


def test_deadline_of_the_wrong_type_is_refused():
    entry = {"name": "a", "phase": "Running", "deadline": 12}
    assert field_error(with_entries(entry)).field == "entries[0].deadline"


def test_cpu_count_that_is_a_string_is_refused():
    entry = {"name": "a", "phase": "Running", "cpuCount": "2"}
    assert field_error(with_entries(entry)).field == "entries[0].cpuCount"


def test_wrong_kind_is_refused():
    error = field_error({"kind": "Node", "node": "n1"})
    assert error.field == "kind"
    assert "'Node'" in error.problem


def test_metadata_name_that_differs_from_node_is_refused():
    error = field_error({"metadata": {"name": "n2"}, "node": "n1"})
    assert error.field == "metadata.name"
    assert "'n2'" in error.problem
    assert "'n1'" in error.problem


def test_missing_node_is_refused():
    error = field_error({"metadata": {}, "pools": []})
    assert (error.field, error.problem) == ("node", "required")


def test_node_that_is_not_a_string_is_refused():
    assert field_error({"node": 7}).field == "node"


def test_address_that_is_not_a_string_is_refused():
    assert field_error({"node": "n1", "address": 7777}).field == "address"


def test_pools_that_is_not_a_list_is_refused():
    assert field_error({"node": "n1", "pools": {"template": "python"}}).field == "pools"


def test_template_that_is_not_an_object_is_refused():
    assert field_error({"node": "n1", "templates": ["python"]}).field == "templates[0]"


def test_object_that_is_not_a_mapping_is_refused():
    error = field_error(["node", "n1"])
    assert error.field == ""
    assert "list" in error.problem


def test_format_error_message_names_place_field_and_problem():
    error = field_error(with_pool(warm=-1)).located("inv/n1.yaml")
    assert error.field == "pools[0].warm"
    assert str(error) == "inv/n1.yaml: pools[0].warm: must not be negative, got -1"
    nested = error.located("dir")
    assert str(nested).startswith("dir: inv/n1.yaml: pools[0].warm: ")


# --- names and pool keys ----------------------------------------------------------------------


def test_split_name_with_a_slash():
    assert split_name("team/notebook") == ("team", "notebook")


def test_split_name_without_a_slash_lives_in_default():
    assert split_name("notebook") == ("default", "notebook")


def test_split_name_splits_at_the_first_slash_only():
    assert split_name("team/a/b") == ("team", "a/b")


def test_entry_namespaced_name_uses_split_name():
    assert Entry(name="scratch", phase="Running").namespaced_name == ("default", "scratch")
    assert Entry(name="t/x", phase="Running").namespaced_name == ("t", "x")


def test_pool_key_of_fills_in_net_none_and_size_small():
    assert PoolKey.of("python") == PoolKey("python", "none", "small")
    assert PoolKey.of("python", "", "") == PoolKey("python", "none", "small")
    assert PoolKey.of("python", None, "large") == PoolKey("python", "none", "large")


def test_pool_key_of_keeps_given_net_and_size():
    key = PoolKey.of("python", "bridge", "large")
    assert (key.net, key.size) == ("bridge", "large")
    assert str(key) == "python/bridge/large"


def test_a_defaulted_key_equals_an_explicit_one():
    assert PoolKey.of("python") == PoolKey.of("python", "none", "small")
    assert len({PoolKey.of("python"), PoolKey("python", "none", "small")}) == 1

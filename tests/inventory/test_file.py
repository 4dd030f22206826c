"""The file source: objects, lists, directories, and malformed input that fails whole."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from sandboxctl.clock import ManualClock
from sandboxctl.core.errors import InventoryFormatError
from sandboxctl.core.model import inventory_to_object
from sandboxctl.inventory import InventorySource
from sandboxctl.inventory.file import FileInventorySource, load_path, load_text

T0 = datetime(2026, 11, 30, 4, 0, tzinfo=UTC)


def _object(node: str, **fields: object) -> dict[str, object]:
    obj: dict[str, object] = {
        "apiVersion": "sandbox.cocoonstack.io/v1beta1",
        "kind": "NodeInventory",
        "metadata": {"name": node},
        "node": node,
        "address": f"{node}.fleet.test:7777",
        "pools": [{"template": "base", "warm": 2, "target": 4}],
        "entries": [{"name": f"default/{node}-sb", "id": f"sb_{node}", "phase": "Running"}],
        "publishedAt": "2026-11-30T04:00:00Z",
    }
    obj.update(fields)
    return obj


def test_reads_the_list_kubectl_prints(tmp_path: Path) -> None:
    listing = {"apiVersion": "v1", "kind": "List", "items": [_object("a"), _object("b")]}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(listing))

    inventories = load_path(path)

    assert [i.node for i in inventories] == ["a", "b"]
    assert inventories[0].entries[0].id == "sb_a"
    assert inventories[0].published_at == T0


def test_reads_multi_document_yaml_and_a_json_file_in_a_directory(tmp_path: Path) -> None:
    (tmp_path / "one.yaml").write_text(
        yaml.safe_dump(_object("a")) + "---\n" + yaml.safe_dump(_object("b"))
    )
    (tmp_path / "two.json").write_text(json.dumps(_object("c")))
    (tmp_path / "notes.txt").write_text("not an inventory")

    nodes = [i.node for i in load_path(tmp_path)]

    assert nodes == ["a", "b", "c"]


def test_an_unquoted_yaml_timestamp_is_still_a_stamp() -> None:
    text = yaml.safe_dump(_object("a")).replace("'2026-11-30T04:00:00Z'", "2026-11-30T04:00:00Z")
    assert "publishedAt: 2026-11-30T04:00:00Z" in text

    (inventory,) = load_text(text)

    assert inventory.published_at == T0


def test_a_written_inventory_reads_back_the_same(tmp_path: Path) -> None:
    (original,) = load_text(yaml.safe_dump(_object("a")))
    (again,) = load_text(json.dumps(inventory_to_object(original)))
    assert again == original


def test_a_malformed_object_names_file_object_and_field_and_fails_the_whole_load(
    tmp_path: Path,
) -> None:
    bad = _object("b", entries=[{"name": "default/x", "id": "sb_x"}])
    listing = {"kind": "List", "items": [_object("a"), bad]}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(listing))

    with pytest.raises(InventoryFormatError) as caught:
        load_path(path)

    message = str(caught.value)
    assert str(path) in message
    assert "items[1] (b)" in message
    assert "entries[0].phase: required" in message


def test_the_same_node_twice_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(_object("a")))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(_object("a")))
    with pytest.raises(InventoryFormatError, match=r"'a' is already defined at .*a\.yaml"):
        load_path(tmp_path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: [", "invalid YAML at line"),
        ("- 1\n- 2\n", r"items\[0\]: expected an object, got int"),
        ("kind: Pod\nmetadata: {name: x}\n", "kind: expected NodeInventory"),
    ],
)
def test_unreadable_text_is_one_clear_error(text: str, expected: str) -> None:
    with pytest.raises(InventoryFormatError, match=expected):
        load_text(text, "input.yaml")


def test_invalid_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "fleet.json"
    path.write_text('{"kind": "NodeInventory",\n "node": }')
    with pytest.raises(InventoryFormatError, match=r"fleet.json: invalid JSON at line 2"):
        load_path(path)


def test_a_missing_path_and_an_empty_directory_are_errors(tmp_path: Path) -> None:
    with pytest.raises(InventoryFormatError, match="no such file"):
        load_path(tmp_path / "absent.yaml")
    with pytest.raises(InventoryFormatError, match=r"no \.yaml, \.yml or \.json files"):
        load_path(tmp_path)


def test_the_source_serves_a_snapshot_and_reloads(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(_object("a")))
    source = FileInventorySource(path, clock=ManualClock(T0))
    assert isinstance(source, InventorySource)
    first = source.snapshot()
    assert first.nodes == ("a",)

    reloaded: list[tuple[str, ...]] = []
    source.subscribe(lambda: reloaded.append(source.snapshot().nodes))
    path.write_text(yaml.safe_dump(_object("a")) + "---\n" + yaml.safe_dump(_object("b")))
    source.reload()
    assert reloaded == [("a", "b")]  # a reload notifies, after the swap

    assert source.snapshot().nodes == ("a", "b")
    assert first.nodes == ("a",)  # a reader holding the old snapshot is not disturbed


def test_a_failed_reload_keeps_the_last_good_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(_object("a")))
    source = FileInventorySource(path, clock=ManualClock(T0))
    path.write_text("kind: NodeInventory\n")

    with pytest.raises(InventoryFormatError):
        source.reload()

    assert source.snapshot().nodes == ("a",)

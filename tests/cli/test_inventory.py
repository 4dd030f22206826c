"""``sandboxctl inventory`` as an operator and a cron job use it."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli.conftest import Run

NOW = "2026-11-30T04:00:30Z"


def _node(name: str, published: str | None, entries: int = 1, warm: int = 2) -> dict[str, object]:
    obj: dict[str, object] = {
        "apiVersion": "sandbox.cocoonstack.io/v1beta1",
        "kind": "NodeInventory",
        "metadata": {"name": name},
        "node": name,
        "address": f"{name}.fleet.test:7777",
        "pools": [{"template": "base", "warm": warm, "target": 4}],
        "entries": [
            {"name": f"default/{name}-{i}", "id": f"sb_{name}_{i}", "phase": "Running"}
            for i in range(entries)
        ],
    }
    if published is not None:
        obj["publishedAt"] = published
    return obj


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    """a fresh, b 2m30s behind (stale), c an hour ahead, d an old publisher."""
    items = [
        _node("a", "2026-11-30T04:00:00Z", entries=3),
        _node("b", "2026-11-30T03:58:00Z"),
        _node("c", "2026-11-30T05:00:00Z"),
        _node("d", None),
    ]
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    return path


def test_json_report_gives_each_node_its_state_and_the_reference(run: Run, fleet: Path) -> None:
    result = run("inventory", "--from", str(fleet), "--now", NOW, "-o", "json")

    assert result.code == 0
    report = json.loads(result.out)
    states = {n["node"]: n["state"] for n in report["nodes"]}
    assert states == {"a": "fresh", "b": "stale", "c": "ahead", "d": "unstamped"}
    assert report["reference"] == {
        "at": NOW,
        "origin": "capped-by-now",
        "newestPublish": "2026-11-30T05:00:00Z",
    }
    ages = {n["node"]: n["ageSeconds"] for n in report["nodes"]}
    assert ages == {"a": 30.0, "b": 150.0, "c": -3570.0, "d": None}
    assert report["counts"] == {"fresh": 1, "stale": 1, "unstamped": 1, "ahead": 1}
    assert report["nodes"][0]["sandboxes"] == 3
    assert report["nodes"][0]["warm"] == 2


def test_yaml_output_is_the_same_document(run: Run, fleet: Path) -> None:
    as_json = json.loads(run("inventory", "--from", str(fleet), "--now", NOW, "-o", "json").out)
    as_yaml = yaml.safe_load(run("inventory", "--from", str(fleet), "--now", NOW, "-o", "yaml").out)
    assert as_yaml == as_json


def test_the_table_shows_the_reference_and_every_node(run: Run, fleet: Path) -> None:
    result = run("inventory", "--from", str(fleet), "--now", NOW)

    assert result.code == 0
    assert "reference: 2026-11-30T04:00:30Z (capped by now" in result.out
    for node, state in (("a", "fresh"), ("b", "stale"), ("c", "ahead"), ("d", "unstamped")):
        assert any(line.split()[:1] == [node] and state in line for line in result.out.splitlines())


def test_fail_on_stale_exits_3_only_when_a_node_is_stale(run: Run, fleet: Path) -> None:
    assert run("inventory", "--from", str(fleet), "--now", NOW, "--fail-on-stale").code == 3
    # A wider window keeps b: nothing is stale, so the same check passes.
    wide = run(
        "inventory", "--from", str(fleet), "--now", NOW, "--fail-on-stale", "--stale-after", "3m"
    )
    assert wide.code == 0


def test_the_window_is_strictly_greater(run: Run, fleet: Path) -> None:
    # b trails the reference (04:00:30) by exactly 150 s.
    kept = run(
        "inventory", "--from", str(fleet), "--now", NOW, "--stale-after", "2m30s", "-o", "json"
    )
    dropped = run(
        "inventory", "--from", str(fleet), "--now", NOW, "--stale-after", "149s", "-o", "json"
    )
    state_of_b = [
        next(n["state"] for n in json.loads(r.out)["nodes"] if n["node"] == "b")
        for r in (kept, dropped)
    ]
    assert state_of_b == ["fresh", "stale"]


def test_reads_kubectl_output_from_stdin(
    run: Run, fleet: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(fleet.read_text()))
    result = run("inventory", "--from", "-", "--now", NOW, "-o", "json")
    assert [n["node"] for n in json.loads(result.out)["nodes"]] == ["a", "b", "c", "d"]


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--stale-after", "90"], "--stale-after"),
        (["--stale-after", "soon"], "--stale-after"),
        (["--now", "yesterday"], "--now"),
        (["-o", "xml"], "--output"),
    ],
)
def test_a_bad_flag_is_one_line_naming_it(
    run: Run, fleet: Path, args: list[str], names: str
) -> None:
    result = run("inventory", "--from", str(fleet), *args)
    assert result.code == 2
    assert result.out == ""
    assert result.err.count("\n") == 1
    assert names in result.err


def test_extrapolate_refuses_an_unsafe_window(run: Run, fleet: Path) -> None:
    result = run(
        "inventory", "--from", str(fleet), "--inventory-reference", "extrapolate",
        "--stale-after", "60s", "--publish-interval", "30s",
    )  # fmt: skip
    assert result.code == 2
    assert result.err.count("\n") == 1
    assert "above twice --publish-interval" in result.err


def test_a_malformed_file_is_one_line_and_nothing_is_shown(run: Run, tmp_path: Path) -> None:
    bad = _node("b", "2026-11-30T04:00:00Z")
    bad["pools"] = [{"template": "base", "warm": "many", "target": 4}]
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"kind": "List", "items": [_node("a", None), bad]}))

    result = run("inventory", "--from", str(path), "--now", NOW)

    assert result.code == 2
    assert result.out == ""
    assert result.err.strip() == (
        f"sandboxctl: error: {path}: items[1] (b): pools[0].warm: expected an integer, got str"
    )


@pytest.mark.services  # runs the installed command
def test_the_installed_command_prints_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("kind: NodeInventory\nnode: [\n")
    command = [sys.executable, "-m", "sandboxctl", "inventory", "--from", str(path)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("sandboxctl: error: ")


def test_version_and_help(run: Run) -> None:
    assert run("--version").out.startswith("sandboxctl ")
    for verb in ("inventory", "simulate"):
        result = run(verb, "--help")
        assert result.code == 0
        assert "--inventory-stale-after" in result.out

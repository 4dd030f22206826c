"""``sandboxctl simulate``: the rule over a timeline, as an operator reads it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.cli.conftest import Run

SCENARIO = (
    "--nodes", "a,b,c,d", "--publish-interval", "30s", "--stale-after", "90s",
    "--kill", "b@100s", "--restart", "b@400s", "--outage", "200s-340s",
    "--old-publisher", "d", "--until", "600s",
)  # fmt: skip


def _json(run: Run, *args: str) -> dict[str, Any]:
    result = run("simulate", *args, "-o", "json")
    assert result.code == 0, result.err
    report: dict[str, Any] = json.loads(result.out)
    return report


def _events(report: dict[str, Any], node: str) -> list[tuple[str, float]]:
    events = next(n["events"] for n in report["nodes"] if n["node"] == node)
    return [(e["event"], e["atSeconds"]) for e in events]


def test_a_killed_node_leaves_inside_its_bound_and_returns_on_restart(run: Run) -> None:
    report = _json(run, *SCENARIO)

    b = _events(report, "b")
    assert [event for event, _ in b] == ["joined", "left", "returned"]
    (bound,) = report["deadNodeBounds"]
    assert bound["node"] == "b"
    assert bound["held"] is True
    assert bound["earliestLeaveSeconds"] <= b[1][1] <= bound["latestLeaveSeconds"]
    assert b[2][1] == 400.0


def test_the_outage_drops_no_live_node_and_the_old_publisher_stays(run: Run) -> None:
    report = _json(run, *SCENARIO)
    for node in ("a", "c", "d"):
        assert [event for event, _ in _events(report, node)] == ["joined"]
    finals = {n["node"]: n["finalState"] for n in report["nodes"]}
    assert finals == {"a": "fresh", "b": "fresh", "c": "fresh", "d": "unstamped"}


def test_a_clock_ahead_is_kept_but_lets_an_outage_drop_the_others(run: Run) -> None:
    report = _json(run, *SCENARIO, "--skew", "c=+1h")

    assert [event for event, _ in _events(report, "c")] == ["joined"]
    assert "left" in [event for event, _ in _events(report, "a")]
    assert any("c stamps 3600s ahead" in w for w in report["warnings"])


def test_extrapolate_bounds_a_dead_node_by_one_read_tick(run: Run) -> None:
    report = _json(run, *SCENARIO, "--reference", "extrapolate", "--stale-after", "61s")
    (bound,) = report["deadNodeBounds"]
    assert bound["latestLeaveSeconds"] - bound["earliestLeaveSeconds"] == 1.0
    assert bound["held"] is True


def test_unsafe_settings_are_simulated_with_warnings(run: Run) -> None:
    report = _json(run, "--nodes", "a,b", "--stale-after", "30s", "--publish-interval", "30s")
    assert any("not above the publish interval" in w for w in report["warnings"])


def test_the_table_tells_the_story(run: Run) -> None:
    result = run("simulate", *SCENARIO)
    assert result.code == 0
    assert "dead-node bound: b last published at 97.5s" in result.out
    assert "within the bound" in result.out
    assert any(" b " in f" {line} " and "left" in line for line in result.out.splitlines())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "a", "--kill", "z@10s"], "--kill: unknown node 'z'"),
        (["--nodes", "a", "--kill", "a"], "--kill 'a': expected NODE@TIME"),
        (["--nodes", "a", "--outage", "300s-200s"], "the end must be after the start"),
        (["--nodes", "a", "--outage", "300s"], "expected START-END"),
        (["--nodes", "a", "--skew", "a=soon"], "--skew: invalid duration"),
        (["--nodes", "a", "--until", "10"], "--until: invalid duration"),
        (["--nodes", ","], "--nodes: name at least one node"),
    ],
)
def test_bad_scenarios_are_one_line(run: Run, args: list[str], message: str) -> None:
    result = run("simulate", *args)
    assert result.code == 2
    assert result.err.count("\n") == 1
    assert message in result.err

"""The lanes' framework without a kit: the selector, the runner's bookkeeping (every
selected lane gets one verdict, heal between scenarios), the report's renderings and
the CLI's answers to bad input (one line, exit 2)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

from sandboxctl.lanes import catalog, local, report
from sandboxctl.lanes.kit import Kit
from sandboxctl.lanes.model import EXTERNAL, LOCAL, Lane, LaneError, Progress, Verdict, Windows
from sandboxctl.lanes.runner import Run, run_plan
from tests.cli.conftest import Run as Cli

WINDOWS = Windows(publish=3.0, stale_after=9.0)


# --- the selector ------------------------------------------------------------------------


def _selected(selectors: list[str], kit: str = LOCAL) -> list[str]:
    return sorted(lane for _, picked in catalog.select(selectors, kit) for lane in picked)


def test_a_group_an_id_and_all_select_in_the_catalogs_order() -> None:
    assert _selected(["k1a"]) == [f"K1A-{n:02d}" for n in range(1, 10)]
    assert _selected(["K1A-03", "K1C-01"]) == ["K1A-03", "K1C-01"]
    assert _selected(["all"]) == sorted(lane.id for lane in catalog.lanes())
    order = [scenario.lanes[0].group for scenario, _ in catalog.select(["K1C", "K1A"], LOCAL)]
    assert order == ["K1A", "K1C"]  # the catalog's run order, not the selectors'


def test_a_local_only_lane_is_refused_by_id_and_left_out_by_group_on_external() -> None:
    local_only = [lane for lane in catalog.lanes() if lane.kits == frozenset({LOCAL})]
    assert local_only  # the guard lanes
    with pytest.raises(LaneError, match="does not run on the external kit"):
        catalog.select([local_only[0].id], EXTERNAL)
    assert local_only[0].id not in _selected(["all"], EXTERNAL)


@pytest.mark.parametrize("selectors", [[], ["K1Z"], ["K1A-99"]])
def test_an_unknown_or_missing_selector_is_refused(selectors: list[str]) -> None:
    with pytest.raises(LaneError):
        catalog.select(selectors, LOCAL)


# --- the runner --------------------------------------------------------------------------


def _lane(lane_id: str) -> Lane:
    return Lane(lane_id, lane_id.split("-")[0], "a stand-in")


@dataclass
class Scripted:
    """A scenario that yields what it is given, then raises ``fails`` if set."""

    lanes: tuple[Lane, ...]
    yields: list[Verdict]
    fails: str = ""
    ran: list[frozenset[str]] = field(default_factory=list)

    def run(self, kit: Kit, selected: frozenset[str], progress: Progress) -> Iterable[Verdict]:
        self.ran.append(selected)
        yield from self.yields
        if self.fails:
            raise RuntimeError(self.fails)


class FakeKit:
    name = LOCAL
    windows = WINDOWS
    control_plane_name = "kube-apiserver v1.35.4 + etcd 3.6.5"

    def __init__(self, heal_fails: bool = False) -> None:
        self.heals = 0
        self.heal_fails = heal_fails

    def heal(self, progress: Progress) -> None:
        self.heals += 1
        if self.heal_fails:
            raise LaneError("agent-b exited with 1")


class Quiet:
    def wait_for(self, what: str, check: Any, bound: float) -> Any:
        return check()

    def note(self, text: str) -> None:
        pass


def _run(plan: list[tuple[Scripted, frozenset[str]]], kit: FakeKit) -> Run:
    ticks: Iterator[float] = itertools.count(0.0, 1.0)
    return run_plan(cast(Any, plan), cast(Kit, kit), Quiet(), clock=lambda: next(ticks))


def test_every_selected_lane_gets_one_verdict_and_the_kit_heals_between_scenarios() -> None:
    first = Scripted(
        (_lane("X-01"), _lane("X-02"), _lane("X-03")),
        [Verdict("X-01", True, "f1", "b1"), Verdict("X-03", True, "f3", "b3")],
        fails="B never left the lists",
    )
    second = Scripted(
        (_lane("Y-01"),), [Verdict("Y-01", True, "f", "b"), Verdict("Z-09", True, "", "")]
    )
    kit = FakeKit()
    result = _run(
        [(first, frozenset({"X-01", "X-02", "X-03"})), (second, frozenset({"Y-01"}))], kit
    )

    assert [(v.lane, v.passed) for v in result.verdicts] == [
        ("X-01", True), ("X-02", False), ("X-03", True), ("Y-01", True),
    ]  # fmt: skip
    assert result.verdicts[1].detail == "B never left the lists"
    assert kit.heals == 1  # between the scenarios only: the kit was built healed
    assert all(v.seconds > 0 for v in result.verdicts if v.passed)
    assert not result.passed


def test_a_lane_the_scenario_never_judges_fails_and_a_kit_that_cannot_heal_fails_the_next() -> None:
    silent = Scripted((_lane("X-01"),), [])
    after = Scripted((_lane("Y-01"),), [Verdict("Y-01", True, "f", "b")])
    result = _run([(silent, frozenset({"X-01"})), (after, frozenset({"Y-01"}))], FakeKit(True))

    assert [(v.lane, v.passed) for v in result.verdicts] == [("X-01", False), ("Y-01", False)]
    assert result.verdicts[0].detail == "its scenario did not judge it"
    assert result.verdicts[1].detail == "the kit did not heal: agent-b exited with 1"
    assert after.ran == []


# --- the report --------------------------------------------------------------------------


def _result() -> Run:
    return Run(
        LOCAL,
        WINDOWS,
        datetime(2026, 12, 1, 15, 0, tzinfo=UTC),
        [
            Verdict(
                "K1A-03", True, "left 9.7 s after B's last publish", "[9.0 s, 14.0 s]", "", 12.3
            ),
            Verdict("K1A-08", False, "3 packets before, 1 after", "0 after", "B was asked", 0.5),
        ],
        seconds=81.25,
    )


def test_the_table_has_one_line_per_lane_with_the_reason_under_a_fail() -> None:
    lines = report.table(_result()).splitlines()
    assert lines[0].startswith("PASS  K1A-03  left 9.7 s after B's last publish")
    assert "bound [9.0 s, 14.0 s]" in lines[0]
    assert lines[1].startswith("FAIL  K1A-08")
    assert lines[2].strip() == "why: B was asked"
    assert lines[3] == (
        "1 of 2 lanes passed on the local kit (publish 3 s, stale after 9 s) in 81.2 s"
    )


def test_the_report_file_is_json_with_markdown_beside_it(tmp_path: Path) -> None:
    written, beside = report.write(_result(), tmp_path / "lanes.json")

    assert beside == tmp_path / "lanes.md"
    body = json.loads(written.read_text())
    assert body["passed"] is False
    assert body["windows"] == {"publish": 3.0, "stale_after": 9.0}
    assert [(lane["lane"], lane["result"]) for lane in body["lanes"]] == [
        ("K1A-03", "PASS"), ("K1A-08", "FAIL"),
    ]  # fmt: skip
    markdown = beside.read_text()
    assert (
        "| K1A-08 | **FAIL** | 3 packets before, 1 after | 0 after | 0.5 | B was asked |"
        in markdown
    )
    with pytest.raises(LaneError, match="name the JSON file"):
        report.write(_result(), tmp_path / "lanes.md")


def test_the_report_names_the_control_plane_the_kit_ran_on(tmp_path: Path) -> None:
    result = _run([(Scripted((_lane("X-01"),), [Verdict("X-01", True, "f", "b")]),
                    frozenset({"X-01"}))], FakeKit())  # fmt: skip
    assert result.control_plane == FakeKit.control_plane_name

    written, beside = report.write(result, tmp_path / "lanes.json")

    assert json.loads(written.read_text())["control_plane"] == FakeKit.control_plane_name
    assert f"Control plane: {FakeKit.control_plane_name}." in beside.read_text()
    assert (
        report.table(result)
        .splitlines()[-1]
        .startswith(
            f"1 of 1 lanes passed on the local kit on {FakeKit.control_plane_name} (publish 3 s"
        )
    )


def test_a_detail_of_several_lines_keeps_them_under_its_lanes_heading() -> None:
    timeline = "t | replica-0\n1.5 s | up\n4.5 s | up"
    run = _result()
    run.verdicts[0] = Verdict("K1OUT-01", True, "outage 36.1 s", ">= 36 s", timeline, 40.0)

    markdown = report.markdown(run)

    assert "| K1OUT-01 | **PASS** | outage 36.1 s | >= 36 s | 40.0 | below |" in markdown
    assert f"## K1OUT-01\n\n```\n{timeline}\n```" in markdown


# --- the CLI -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["K1Z"], "no lane or group 'K1Z'"),
        ([], "Missing argument"),
        (["K1A", "--kit", "cloud"], "--kit 'cloud': expected one of local, external"),
        (["K1A", "--config", "lanes.yaml"], "the local kit needs none"),
        (["K1A", "--kit", "external"], "--kit external needs --config FILE"),
        (["G-01", "--kit", "external", "--config", "x.yaml"], "does not run on the external kit"),
        (["K1A", "--report", "out.md"], "name the JSON file"),
        (["K1A", "--report", "/no/such/dir/r.json"], "no directory /no/such/dir"),
        (["K1A", "-o", "yaml"], "Invalid value"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_any_kit(
    run: Cli, args: list[str], says: str
) -> None:
    result = run("lanes", "run", *args)
    assert result.code == 2
    assert says in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert "Traceback" not in result.err


def test_a_local_kit_that_cannot_come_up_is_a_failed_run_exit_1(
    run: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local, "unavailable", lambda: "no namespaces on this machine")
    result = run("lanes", "run", "SBL-09")
    assert result.code == 1
    assert result.err.strip().splitlines() == [
        "sandboxctl: error: the local kit cannot run here: no namespaces on this machine"
    ]


def test_list_names_every_lane_with_its_kits(run: Cli) -> None:
    result = run("lanes", "list", "-o", "json")
    assert result.code == 0
    rows = json.loads(result.out)
    assert [row["id"] for row in rows] == [lane.id for lane in catalog.lanes()]
    k1a08 = next(row for row in rows if row["id"] == "K1A-08")
    assert k1a08 == {
        "id": "K1A-08", "group": "K1A", "kits": ["external", "local"],
        "proves": catalog.lanes()[[lane.id for lane in catalog.lanes()].index("K1A-08")].proves,
    }  # fmt: skip
    table = run("lanes", "list").out.splitlines()
    assert table[0].split() == ["LANE", "GROUP", "KITS", "PROVES"]
    assert len(table) == len(rows) + 1


def test_a_report_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "taken.json").mkdir()  # a directory where the file should go
    with pytest.raises(LaneError, match=r"^--report .*taken.json: Is a directory$"):
        report.write(_result(), tmp_path / "taken.json")

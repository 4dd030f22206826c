"""Runs a plan (scenarios and their selected lanes, from ``catalog.select``) on a kit:
every selected lane gets exactly one verdict, in the catalog's order. A lane its scenario
did not judge, or whose scenario raised, FAILs with the reason; the kit is healed between
scenarios, and a kit that cannot heal FAILs the lanes of the scenario that needed it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from sandboxctl.lanes.kit import Kit
from sandboxctl.lanes.model import Progress, Scenario, Verdict, Windows

Plan = Sequence[tuple[Scenario, frozenset[str]]]


@dataclass
class Run:
    """A run's result: the kit, its windows, the verdicts, the wall time, and what the
    kit's control plane was (the report says what the lanes ran on)."""

    kit: str
    windows: Windows
    started: datetime
    verdicts: list[Verdict] = field(default_factory=list)
    seconds: float = 0.0
    control_plane: str = ""

    @property
    def passed(self) -> bool:
        return bool(self.verdicts) and all(verdict.passed for verdict in self.verdicts)


def run_plan(
    plan: Plan,
    kit: Kit,
    progress: Progress,
    clock: Callable[[], float] = time.monotonic,
    started: datetime | None = None,
) -> Run:
    result = Run(kit.name, kit.windows, started or datetime.now(UTC))
    result.control_plane = kit.control_plane_name
    began = clock()
    for index, (scenario, selected) in enumerate(plan):
        if index:
            try:
                kit.heal(progress)
            except Exception as error:
                result.verdicts += _unjudged(
                    scenario, selected, {}, f"the kit did not heal: {_line(error)}"
                )
                continue
        result.verdicts += run_scenario(scenario, selected, kit, progress, clock)
    result.seconds = clock() - began
    return result


def run_scenario(
    scenario: Scenario,
    selected: frozenset[str],
    kit: Kit,
    progress: Progress,
    clock: Callable[[], float] = time.monotonic,
) -> list[Verdict]:
    """The scenario's verdicts for ``selected``, each timed from the previous one."""
    judged: dict[str, Verdict] = {}
    reason = "its scenario did not judge it"
    mark = clock()
    try:
        for verdict in scenario.run(kit, selected, progress):
            now = clock()
            if verdict.lane in selected and verdict.lane not in judged:
                judged[verdict.lane] = replace(verdict, seconds=now - mark)
                shown = "PASS" if verdict.passed else "FAIL"
                progress.note(f"{shown} {verdict.lane}: {verdict.figure}")
            mark = now
    except Exception as error:
        reason = _line(error)
        progress.note(f"{type(scenario).__name__} stopped: {reason}")
    seconds = clock() - mark
    return _unjudged(scenario, selected, judged, reason, seconds)


def _unjudged(
    scenario: Scenario,
    selected: frozenset[str],
    judged: dict[str, Verdict],
    reason: str,
    seconds: float = 0.0,
) -> list[Verdict]:
    """Every selected lane of the scenario in its order: judged, or FAIL with ``reason``."""
    out = []
    for lane in scenario.lanes:
        if lane.id not in selected:
            continue
        verdict = judged.get(lane.id)
        if verdict is None:
            verdict = Verdict(lane.id, False, "not measured", "", reason, seconds)
            seconds = 0.0  # the time until the failure is the first unjudged lane's
        out.append(verdict)
    return out


def _line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text

"""The lane report: one line per lane (PASS or FAIL, the figure measured, the bound it
was judged against), as a table for a terminal, JSON, and Markdown. ``--report FILE``
writes the JSON to FILE and the Markdown beside it, FILE with its suffix replaced by
``.md`` (report.json -> report.md)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sandboxctl.lanes.model import Lane, LaneError, Verdict
from sandboxctl.lanes.runner import Run


def result(verdict: Verdict) -> str:
    return "PASS" if verdict.passed else "FAIL"


def to_json(run: Run) -> dict[str, Any]:
    return {
        "kit": run.kit,
        "control_plane": run.control_plane,
        "windows": {"publish": run.windows.publish, "stale_after": run.windows.stale_after},
        "started": run.started.isoformat(timespec="seconds"),
        "seconds": round(run.seconds, 1),
        "passed": run.passed,
        "lanes": [
            {
                "lane": verdict.lane,
                "result": result(verdict),
                "figure": verdict.figure,
                "bound": verdict.bound,
                "detail": verdict.detail,
                "seconds": round(verdict.seconds, 1),
            }
            for verdict in run.verdicts
        ],
    }


def table(run: Run) -> str:
    """The report for a terminal: one line per lane, a FAIL's reason under it, a total."""
    width = max((len(verdict.lane) for verdict in run.verdicts), default=6)
    lines = []
    for verdict in run.verdicts:
        bound = f"  bound {verdict.bound}" if verdict.bound else ""
        lines.append(
            f"{result(verdict)}  {verdict.lane:<{width}}  {verdict.figure}{bound}"
            f"  ({verdict.seconds:.1f} s)"
        )
        if verdict.detail and not verdict.passed:
            lines.append(f"{'':6}{'':<{width}}  why: {verdict.detail}")
    failed = sum(not verdict.passed for verdict in run.verdicts)
    lines.append(
        f"{len(run.verdicts) - failed} of {len(run.verdicts)} lanes passed on the {run.kit} "
        f"kit{_on(run)} (publish {run.windows.publish:g} s, stale after "
        f"{run.windows.stale_after:g} s) in {run.seconds:.1f} s"
    )
    return "\n".join(lines)


def markdown(run: Run) -> str:
    lines = [
        f"# Lane report: {run.kit} kit, {run.started.isoformat(timespec='seconds')}",
        "",
        *([f"Control plane: {run.control_plane}.", ""] if run.control_plane else []),
        f"Windows: publish {run.windows.publish:g} s, stale after {run.windows.stale_after:g} s. "
        f"Wall time {run.seconds:.1f} s. "
        f"{'Every lane passed.' if run.passed else 'Some lanes FAILED.'}",
        "",
        "| Lane | Result | Figure | Bound | Seconds | Detail |",
        "|---|---|---|---|---|---|",
    ]
    for verdict in run.verdicts:
        cells = [
            verdict.lane,
            f"**{result(verdict)}**",
            verdict.figure,
            verdict.bound,
            f"{verdict.seconds:.1f}",
            "below" if "\n" in verdict.detail else verdict.detail,
        ]
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    # A detail of several lines (K1OUT-01's timeline) keeps its lines under a heading.
    for verdict in run.verdicts:
        if "\n" in verdict.detail:
            lines += ["", f"## {verdict.lane}", "", "```", verdict.detail.strip("\n"), "```"]
    return "\n".join(lines) + "\n"


def markdown_path(path: Path) -> Path:
    """Where the Markdown goes beside the JSON report ``path``; a ``.md`` path itself is
    refused (it would be the JSON's and the Markdown's at once)."""
    if path.suffix.lower() == ".md":
        raise LaneError(f"--report {path}: name the JSON file; the Markdown goes beside it as .md")
    return path.with_suffix(".md")


def write(run: Run, path: Path) -> tuple[Path, Path]:
    beside = markdown_path(path)
    try:
        path.write_text(json.dumps(to_json(run), indent=2) + "\n", encoding="utf-8")
        beside.write_text(markdown(run), encoding="utf-8")
    except OSError as error:
        raise LaneError(f"--report {path}: {error.strerror or error}") from None
    return path, beside


def lane_rows(lanes: Sequence[Lane]) -> list[dict[str, Any]]:
    return [
        {"id": lane.id, "group": lane.group, "proves": lane.proves, "kits": sorted(lane.kits)}
        for lane in lanes
    ]


def lane_table(lanes: Sequence[Lane]) -> str:
    """``lanes list`` for a terminal: id, group, kits, what it proves."""
    if not lanes:
        return "no lanes"
    width = max(len(lane.id) for lane in lanes)
    group_width = max(len(lane.group) for lane in lanes)
    lines = [f"{'LANE':<{width}}  {'GROUP':<{group_width}}  {'KITS':<14}  PROVES"]
    for lane in lanes:
        kits = ",".join(sorted(lane.kits))
        lines.append(f"{lane.id:<{width}}  {lane.group:<{group_width}}  {kits:<14}  {lane.proves}")
    return "\n".join(lines)


def _on(run: Run) -> str:
    return f" on {run.control_plane}" if run.control_plane else ""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")

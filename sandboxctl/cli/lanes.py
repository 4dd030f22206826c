"""``sandboxctl lanes list|run``: the fault lanes (docs/lanes.md), run on a kit,
PASS or FAIL with the figure each measured. See docs/lanes.md.

``run`` exits 0 when every selected lane passes, 1 when one fails (a kit that did not come
up or go down counts), 2 on bad input (a selector, a flag, a kit's file), 130 when
interrupted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from sandboxctl.cli.options import LanesOutput, TableOrJson
from sandboxctl.cli.render import console
from sandboxctl.lanes import catalog, kits, report
from sandboxctl.lanes.model import KITS, LOCAL, KitDown, LaneError
from sandboxctl.lanes.progress import ConsoleProgress
from sandboxctl.lanes.runner import Run, run_plan

EXIT_LANE_FAILED = 1

app = typer.Typer(
    name="lanes",
    help="The fault lanes (docs/lanes.md): list them, or run them on a kit.",
    no_args_is_help=True,
)


@app.command("list")
def list_lanes(output: LanesOutput = TableOrJson.TABLE) -> None:
    """Every lane: its id, group, the kits it runs on and what it proves."""
    lanes = catalog.lanes()
    if output is TableOrJson.JSON:
        typer.echo(json.dumps(report.lane_rows(lanes), indent=2))
    else:
        typer.echo(report.lane_table(lanes))


@app.command("run")
def run_lanes(
    selectors: Annotated[
        list[str],
        typer.Argument(
            metavar="SELECTOR",
            help="Lane ids (K1A-03), groups (K1A, K1B2, K1C, K1OUT, SBL, G) or 'all'.",
            show_default=False,
        ),
    ],
    kit: Annotated[
        str,
        typer.Option(
            "--kit",
            metavar="|".join(KITS),
            help="local: build a kit on this machine (root; torn down after). external: an "
            "operator's deployment named by --config.",
        ),
    ] = LOCAL,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            metavar="FILE",
            help="The external kit's file (endpoints, credentials, a command per fault).",
        ),
    ] = None,
    report_file: Annotated[
        Path | None,
        typer.Option(
            "--report",
            metavar="FILE",
            help="Write the report as JSON to FILE and as Markdown beside it (FILE with the "
            "suffix .md: report.json -> report.md).",
        ),
    ] = None,
    output: LanesOutput = TableOrJson.TABLE,
    keep: Annotated[
        bool,
        typer.Option("--keep", help="Leave the local kit up afterwards and print how to reach it."),
    ] = False,
) -> None:
    """Run the selected lanes on a kit; exit 0 only when every one passes."""
    kit = kit.lower()
    kits.check(kit, config)
    plan = catalog.select(selectors, kit)
    if report_file is not None:
        report.markdown_path(report_file)  # a bad name fails before a kit is built
        if not report_file.parent.is_dir():
            raise LaneError(f"--report {report_file}: no directory {report_file.parent}")
    lanes = [lane for scenario, picked in plan for lane in scenario.lanes if lane.id in picked]
    progress = ConsoleProgress(console(stderr=True))
    result: Run | None = None
    torn = True  # the kit went down cleanly
    try:
        with kits.open_kit(kit, config, lanes, progress, keep) as built:
            result = run_plan(plan, built, progress)
    except LaneError as error:
        if result is None and not isinstance(error, KitDown):
            raise  # the caller's input: an external kit's file
        # A kit did not come up, or did not go down: the report still counts.
        typer.echo(f"sandboxctl: error: {' '.join(str(error).split())}", err=True)
        if result is None:
            raise typer.Exit(EXIT_LANE_FAILED) from None
        torn = False
    if output is TableOrJson.JSON:
        typer.echo(json.dumps(report.to_json(result), indent=2))
    else:
        typer.echo(report.table(result))
    if report_file is not None:
        written, beside = report.write(result, report_file)
        progress.note(f"report: {written} and {beside}")
    if not result.passed or not torn:
        raise typer.Exit(EXIT_LANE_FAILED)

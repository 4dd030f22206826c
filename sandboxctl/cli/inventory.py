"""``sandboxctl inventory``: which nodes are fresh or stale, and why."""

from __future__ import annotations

import enum
import json
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.table import Table

from sandboxctl.cli import render
from sandboxctl.cli.flags import (
    Kubeconfig,
    SandboxdTokenFile,
    Seeds,
    Source,
    SourceFlags,
    StaleAfter,
    check_source_flags,
    parse_time_flag,
)
from sandboxctl.cli.options import PublishInterval, Reference, freshness_rule
from sandboxctl.clock import SystemClock
from sandboxctl.core.durations import format_duration
from sandboxctl.core.errors import ConfigurationError, InventoryFormatError
from sandboxctl.core.freshness import (
    DEFAULT_PUBLISH_INTERVAL,
    DEFAULT_STALE_AFTER,
    FreshnessRule,
    NodeState,
    ReferenceMode,
    ReferenceOrigin,
)
from sandboxctl.core.model import NodeInventory
from sandboxctl.core.names import REPORTS_API_VERSION
from sandboxctl.core.report import NodeRow, count_states, node_rows
from sandboxctl.core.snapshot import FleetSnapshot, FleetView
from sandboxctl.core.timestamps import format_rfc3339
from sandboxctl.inventory.file import load_path, load_text
from sandboxctl.secretfiles import read_secret

EXIT_STALE = 3
SOURCES = (Source.FILE, Source.MESH, Source.KUBE)
REPORT_KIND = "InventoryReport"


class Output(enum.StrEnum):
    TABLE = "table"
    JSON = "json"
    YAML = "yaml"


_ORIGIN_TEXT = {
    ReferenceOrigin.NONE: "no node is stamped, so every node is fresh",
    ReferenceOrigin.NEWEST_PUBLISH: "the newest publish",
    ReferenceOrigin.EXTRAPOLATED: "the newest publish, advanced by this reader's clock",
    ReferenceOrigin.CAPPED_BY_NOW: "capped by now: the newest publish is ahead of this clock",
}
_STATE_STYLE = {
    NodeState.FRESH: "green",
    NodeState.STALE: "bold red",
    NodeState.UNSTAMPED: "yellow",
    NodeState.AHEAD: "magenta",
}


def inventory(
    path: Annotated[
        str | None,
        typer.Option(
            "--from",
            metavar="PATH",
            help="A NodeInventory YAML or JSON file, a directory of them, or - for stdin "
            "(e.g. kubectl get nodeinventories -o yaml | sandboxctl inventory --from -).",
        ),
    ] = None,
    source: Annotated[
        str,
        typer.Option(
            "--source",
            metavar="file|mesh|kube",
            help="file: read --from. mesh: ask the sandboxd agents (--sandboxd-seeds), as "
            "serve-apiserver does. kube: list the NodeInventory objects (--kubeconfig).",
        ),
    ] = "file",
    seeds: Seeds = "",
    token_file: SandboxdTokenFile = None,
    kubeconfig: Kubeconfig = None,
    stale_after: StaleAfter = DEFAULT_STALE_AFTER,
    reference: Reference = ReferenceMode.PUBLISH,
    publish_interval: PublishInterval = DEFAULT_PUBLISH_INTERVAL,
    now: Annotated[
        datetime | None,
        typer.Option(
            "--now",
            parser=parse_time_flag,
            metavar="RFC3339",
            help="Judge as if the reader's clock read this RFC 3339 time (default: now).",
        ),
    ] = None,
    output: Annotated[
        Output, typer.Option("--output", "-o", help="table, json or yaml.", case_sensitive=False)
    ] = Output.TABLE,
    fail_on_stale: Annotated[
        bool,
        typer.Option(
            "--fail-on-stale",
            help=f"Exit {EXIT_STALE} when any node is stale, or when the input has no node.",
        ),
    ] = False,
) -> None:
    """Show which nodes are fresh or stale, and why."""
    rule = freshness_rule(stale_after, reference, publish_interval)
    flags = check_source_flags(
        source, SOURCES, seeds=seeds, token_file=token_file, kubeconfig=kubeconfig, path=path
    )
    inventories = _read(flags)
    clock = SystemClock()
    at = now or clock.now()
    # A one-shot reader sees the newest stamp for the first time now, so an extrapolating
    # reference has not advanced yet.
    snapshot = FleetSnapshot.build(inventories, seen_at=0.0)
    view = snapshot.view(rule, at, monotonic=0.0)
    rows = node_rows(view)
    for warning in rule.warnings():
        render.console(stderr=True).print(f"[yellow]warning:[/] {warning}")
    if output is Output.TABLE:
        _print_table(view, rows)
    else:
        report = inventory_report(view, rows)
        if output is Output.JSON:
            typer.echo(json.dumps(report, indent=2))
        else:
            typer.echo(yaml.safe_dump(report, sort_keys=False), nl=False)
    if fail_on_stale and any(row.state is NodeState.STALE for row in rows):
        raise typer.Exit(EXIT_STALE)
    if fail_on_stale and not rows:
        # An empty input is what a failed `kubectl ... |` pipe gives a cron job.
        typer.echo("sandboxctl: no nodes in the input", err=True)
        raise typer.Exit(EXIT_STALE)


def _read(flags: SourceFlags) -> list[NodeInventory]:
    if flags.source is Source.KUBE:
        from sandboxctl.inventory.live import list_node_inventories

        return list_node_inventories(flags.kubeconfig)[0]
    if flags.source is Source.MESH:
        return _read_agents(flags.seeds, flags.token_file)
    if flags.path is None:
        raise ConfigurationError("--from PATH is required (or --source mesh|kube)")
    if flags.path != "-":
        return load_path(Path(flags.path))
    text = sys.stdin.read()
    if not text.strip():
        # What a failed `kubectl ... |` leaves: an empty read must not pass as a fleet.
        raise InventoryFormatError(
            "", "nothing was read (did the command before the pipe fail?)", "--from -"
        )
    return load_text(text)


def _read_agents(seeds: tuple[str, ...], token_file: Path | None) -> list[NodeInventory]:
    """One read of every seed: a seed that does not answer is named on stderr, and none
    answering (or one refusing the token) is one line and exit 2."""
    from sandboxctl.inventory.live import check_answers, read_agents

    token = read_secret("--sandboxd-token-file", token_file) if token_file else None
    read = read_agents(seeds, token)
    check_answers(read.results, one_shot=True)
    for failed in read.failed:
        typer.echo(
            f"sandboxctl: sandboxd {failed.address} did not answer: {failed.reason}", err=True
        )
    return list(read.inventories)


def inventory_report(view: FleetView, rows: list[NodeRow]) -> dict[str, Any]:
    """The stable JSON document (see docs/cli.md); fields are only ever added."""
    rule = view.rule
    ref = view.reference
    return {
        "apiVersion": REPORTS_API_VERSION,
        "kind": REPORT_KIND,
        "now": format_rfc3339(view.now),
        "rule": _rule_report(rule),
        "reference": {
            "at": _time(ref.at),
            "origin": ref.origin.value,
            "newestPublish": _time(ref.newest),
        },
        "counts": count_states(rows),
        "nodes": [
            {
                "node": row.node,
                "address": row.address,
                "publishedAt": _time(row.published_at),
                "ageSeconds": _seconds(row.age),
                "state": row.state.value,
                "sandboxes": row.sandboxes,
                "warm": row.warm,
            }
            for row in rows
        ],
    }


def _rule_report(rule: FreshnessRule) -> dict[str, Any]:
    return {
        "staleAfterSeconds": rule.stale_after.total_seconds(),
        "reference": rule.mode.value,
        "publishIntervalSeconds": rule.publish_interval.total_seconds(),
    }


def _time(value: datetime | None) -> str | None:
    return format_rfc3339(value) if value is not None else None


def _seconds(value: timedelta | None) -> float | None:
    return value.total_seconds() if value is not None else None


def _print_table(view: FleetView, rows: list[NodeRow]) -> None:
    console = render.console()
    ref = view.reference
    rule = view.rule
    if ref.at is None:
        console.print(f"reference: none ({_ORIGIN_TEXT[ref.origin]})")
    else:
        console.print(f"reference: {format_rfc3339(ref.at)} ({_ORIGIN_TEXT[ref.origin]})")
    console.print(
        f"now: {format_rfc3339(view.now)}  stale-after: {format_duration(rule.stale_after)}"
        f"  mode: {rule.mode.value}"
    )
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("NODE", "ADDRESS", "PUBLISHED AT", "AGE", "STATE", "SANDBOXES", "WARM"):
        justify = "right" if column in ("AGE", "SANDBOXES", "WARM") else "left"
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        table.add_row(
            row.node,
            row.address or "-",
            _time(row.published_at) or "-",
            format_duration(row.age) if row.age is not None else "-",
            f"[{_STATE_STYLE[row.state]}]{row.state.value}[/]",
            str(row.sandboxes),
            str(row.warm),
        )
    console.print(table)
    counts = count_states(rows)
    console.print(", ".join(f"{n} {state}" for state, n in counts.items() if n) or "no nodes")

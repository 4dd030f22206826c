"""``sandboxctl simulate``: what the freshness rule does under outages, deaths and skew."""

from __future__ import annotations

import enum
import json
from collections import defaultdict
from datetime import timedelta
from typing import Annotated, Any

import typer
from rich.table import Table

from sandboxctl.cli import render
from sandboxctl.cli.options import PublishInterval, Reference, StaleAfter, freshness_rule
from sandboxctl.core.durations import format_duration, parse_duration
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.freshness import (
    DEFAULT_PUBLISH_INTERVAL,
    DEFAULT_STALE_AFTER,
    ReferenceMode,
)
from sandboxctl.core.simulation import Scenario, SimulationResult, format_offset
from sandboxctl.core.simulation import simulate as run


class Output(enum.StrEnum):
    TABLE = "table"
    JSON = "json"


def simulate(
    nodes: Annotated[
        str,
        typer.Option("--nodes", metavar="A,B,C", help="Comma-separated node names, e.g. a,b,c."),
    ],
    publish_interval: PublishInterval = DEFAULT_PUBLISH_INTERVAL,
    stale_after: StaleAfter = DEFAULT_STALE_AFTER,
    reference: Reference = ReferenceMode.PUBLISH,
    kill: Annotated[
        list[str] | None,
        typer.Option("--kill", metavar="NODE@TIME", help="NODE@TIME: the node stops publishing."),
    ] = None,
    restart: Annotated[
        list[str] | None,
        typer.Option("--restart", metavar="NODE@TIME", help="NODE@TIME: the node publishes again."),
    ] = None,
    outage: Annotated[
        list[str] | None,
        typer.Option(
            "--outage", metavar="START-END", help="START-END: every publish in this window fails."
        ),
    ] = None,
    skew: Annotated[
        list[str] | None,
        typer.Option(
            "--skew",
            metavar="NODE=±DURATION",
            help="NODE=±DURATION: the node's clock runs ahead or behind.",
        ),
    ] = None,
    old_publisher: Annotated[
        list[str] | None,
        typer.Option(
            "--old-publisher",
            metavar="NODE",
            help="NODE: a publisher that never stamps publishedAt.",
        ),
    ] = None,
    until: Annotated[
        str, typer.Option("--until", metavar="DURATION", help="How long to simulate.")
    ] = "600s",
    read_tick: Annotated[
        str,
        typer.Option(
            "--read-tick", metavar="DURATION", help="How often the reader reads the fleet."
        ),
    ] = "1s",
    output: Annotated[
        Output, typer.Option("--output", "-o", help="table or json.", case_sensitive=False)
    ] = Output.TABLE,
) -> None:
    """Play the freshness rule over a deterministic timeline; no cluster needed."""
    rule = freshness_rule(stale_after, reference, publish_interval, allow_unsafe=True)
    scenario = Scenario(
        nodes=tuple(_split(nodes)),
        rule=rule,
        until=_duration("--until", until),
        read_tick=_duration("--read-tick", read_tick),
        kills=_node_times("--kill", kill),
        restarts=_node_times("--restart", restart),
        outages=tuple(_range("--outage", text) for text in _items(outage)),
        skews=dict(_skew(text) for text in _items(skew)),
        old_publishers=frozenset(_items(old_publisher)),
    )
    result = run(scenario)
    if output is Output.JSON:
        typer.echo(json.dumps(simulation_report(result), indent=2))
    else:
        _print(result)


def simulation_report(result: SimulationResult) -> dict[str, Any]:
    scenario = result.scenario
    events: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for change in result.transitions:
        events[change.node].append(
            {
                "atSeconds": change.at.total_seconds(),
                "event": change.change.value,
                "why": change.reason,
            }
        )
    return {
        "rule": {
            "staleAfterSeconds": scenario.rule.stale_after.total_seconds(),
            "reference": scenario.rule.mode.value,
            "publishIntervalSeconds": scenario.rule.publish_interval.total_seconds(),
            "readTickSeconds": scenario.read_tick.total_seconds(),
        },
        "untilSeconds": scenario.until.total_seconds(),
        "nodes": [
            {"node": node, "events": events[node], "finalState": result.final_states[node]}
            for node in scenario.nodes
        ],
        "deadNodeBounds": [
            {
                "node": bound.node,
                "lastPublishSeconds": bound.last_publish.total_seconds(),
                "earliestLeaveSeconds": bound.earliest.total_seconds(),
                "latestLeaveSeconds": bound.latest.total_seconds(),
                "leftAtSeconds": bound.left_at.total_seconds() if bound.left_at else None,
                "held": bound.held,
            }
            for bound in result.bounds
        ],
        "warnings": list(result.warnings),
    }


def _print(result: SimulationResult) -> None:
    console = render.console()
    rule = result.scenario.rule
    console.print(
        f"reference: {rule.mode.value}  stale-after: {format_duration(rule.stale_after)}  "
        f"publish-interval: {format_duration(rule.publish_interval)}  "
        f"read-tick: {format_duration(result.scenario.read_tick)}  "
        f"until: {format_offset(result.scenario.until)}"
    )
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("AT", "NODE", "EVENT", "WHY"):
        table.add_column(column, justify="right" if column == "AT" else "left")
    style = {"joined": "", "left": "bold red", "returned": "green"}
    for change in result.transitions:
        event = change.change.value
        table.add_row(
            format_offset(change.at),
            change.node,
            f"[{style[event]}]{event}[/]" if style[event] else event,
            change.reason,
        )
    console.print(table)
    finals = ", ".join(f"{node} {state}" for node, state in result.final_states.items())
    console.print(f"at the end: {finals}")
    for bound in result.bounds:
        if bound.left_at is None:  # still listed although live nodes moved on
            verdict = "[yellow]still listed at the end[/]"
        elif bound.held:
            verdict = f"[green]left at {format_offset(bound.left_at)}, within the bound[/]"
        else:
            verdict = f"[bold red]left at {format_offset(bound.left_at)}, OUTSIDE the bound[/]"
        console.print(
            f"dead-node bound: {bound.node} last published at {format_offset(bound.last_publish)}"
            f", so it must leave between {format_offset(bound.earliest)} and "
            f"{format_offset(bound.latest)}: {verdict}"
        )
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {warning}")


def _items(values: list[str] | None) -> list[str]:
    """Repeated flags and comma-separated lists are the same thing."""
    return [item for value in values or () for item in _split(value)]


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _duration(flag: str, text: str) -> timedelta:
    try:
        return parse_duration(text)
    except InvalidValueError as error:
        raise InvalidValueError(f"{flag}: {error}") from None


def _node_times(flag: str, values: list[str] | None) -> dict[str, tuple[timedelta, ...]]:
    out: dict[str, list[timedelta]] = defaultdict(list)
    for text in _items(values):
        node, at, when = text.partition("@")
        if not at or not node:
            raise InvalidValueError(f"{flag} {text!r}: expected NODE@TIME, e.g. b@100s")
        out[node].append(_duration(flag, when))
    return {node: tuple(sorted(times)) for node, times in out.items()}


def _range(flag: str, text: str) -> tuple[timedelta, timedelta]:
    # Durations may carry a sign, so try every hyphen until both sides parse.
    for at, char in enumerate(text):
        if char == "-" and at > 0:
            try:
                return parse_duration(text[:at]), parse_duration(text[at + 1 :])
            except InvalidValueError:
                continue
    raise InvalidValueError(f"{flag} {text!r}: expected START-END, e.g. 200s-340s")


def _skew(text: str) -> tuple[str, timedelta]:
    node, eq, amount = text.partition("=")
    if not eq or not node:
        raise InvalidValueError(f"--skew {text!r}: expected NODE=±DURATION, e.g. c=+1h")
    return node, _duration("--skew", amount)

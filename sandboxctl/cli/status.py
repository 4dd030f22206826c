"""``sandboxctl status``: one view of a fleet (endpoints, nodes, pools, sandboxes,
templates), once or redrawn until Ctrl-C.

An operator runs it often, so its start counts: its flags come from the light
``cli/flags`` (not ``cli/options``, which loads the servers' stack: a quarter of a
second), and what reads the fleet is imported only when the command runs."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sandboxctl.cli.flags import (
    Kubeconfig,
    SandboxdTokenFile,
    Seeds,
    Source,
    StaleAfter,
    TableOrJson,
    TableOrJsonOutput,
    check_source_flags,
    parse_duration_flag,
)
from sandboxctl.core.durations import format_duration
from sandboxctl.core.errors import ConfigurationError
from sandboxctl.core.freshness import DEFAULT_STALE_AFTER, FreshnessRule
from sandboxctl.core.statedir import DEFAULT_STATE_DIR

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.table import Table

    from sandboxctl.core.status import FleetStatus
    from sandboxctl.inventory.status import StatusSource

DEFAULT_INTERVAL = timedelta(seconds=2)
SOURCES = (Source.STATE, Source.MESH, Source.KUBE)


def status(
    source: Annotated[
        str,
        typer.Option(
            "--source",
            metavar="state|mesh|kube",
            help="state: the fleet serve runs over --state-dir. mesh: ask the agents "
            "(--sandboxd-seeds). kube: the NodeInventory objects (--kubeconfig).",
        ),
    ] = Source.STATE.value,
    state_dir: Annotated[
        Path,
        typer.Option("--state-dir", metavar="DIR", help="serve's state dir (--source state)."),
    ] = DEFAULT_STATE_DIR,
    seeds: Seeds = "",
    token_file: SandboxdTokenFile = None,
    kubeconfig: Kubeconfig = None,
    stale_after: StaleAfter = DEFAULT_STALE_AFTER,
    output: TableOrJsonOutput = TableOrJson.TABLE,
    watch: Annotated[
        bool,
        typer.Option("--watch", "-w", help="Read and redraw every --interval until Ctrl-C."),
    ] = False,
    interval: Annotated[
        timedelta,
        typer.Option(
            "--interval",
            parser=parse_duration_flag,
            metavar="DURATION",
            help="How often --watch reads the fleet again.",
            show_default=format_duration(DEFAULT_INTERVAL),
        ),
    ] = DEFAULT_INTERVAL,
) -> None:
    """Show a fleet at a glance: its endpoints, nodes, warm pools, sandboxes and templates."""
    from sandboxctl.inventory.status import collect_status

    chosen = _source(source, state_dir, seeds, token_file, kubeconfig)
    rule = FreshnessRule(stale_after=stale_after).validate()
    if interval <= timedelta(0):
        raise ConfigurationError(f"--interval must be positive, got {format_duration(interval)}")
    if not watch:
        _draw(collect_status(chosen, rule), output, clear=False)
        return
    _watch(chosen, rule, output, interval)


def _source(
    source: str, state_dir: Path, seeds: str, token_file: Path | None, kubeconfig: Path | None
) -> StatusSource:
    """What the flags name (one line, exit 2 when they do not fit together)."""
    from sandboxctl.inventory.status import FromAgents, FromKube, FromStateDir

    flags = check_source_flags(
        source, SOURCES, seeds=seeds, token_file=token_file, kubeconfig=kubeconfig
    )
    if flags.source is Source.KUBE:
        return FromKube(flags.kubeconfig)
    if flags.source is Source.MESH:
        from sandboxctl.secretfiles import read_secret

        token = read_secret("--sandboxd-token-file", token_file) if token_file else None
        return FromAgents(flags.seeds, token)
    return FromStateDir(state_dir, flags.seeds)


# --- drawing -----------------------------------------------------------------------------


def _draw(status: FleetStatus, output: TableOrJson, clear: bool) -> None:
    if output is TableOrJson.JSON:
        import json

        from sandboxctl.core.status import status_document

        document = status_document(status)
        # A watch writes one document a line (a stream a script reads line by line).
        typer.echo(json.dumps(document) if clear else json.dumps(document, indent=2))
        return
    from sandboxctl.cli import render  # rich: only for a table

    console = render.console()
    if clear and console.is_terminal:
        console.clear()
    _print_table(console, status)
    if clear and not console.is_terminal:
        console.print()  # frames in a pipe or log are apart


def _print_table(console: Console, status: FleetStatus) -> None:
    from sandboxctl.core.timestamps import format_rfc3339

    console.print(
        f"fleet: {status.source}  now: {format_rfc3339(status.now)}  "
        f"stale-after: {format_duration(status.rule.stale_after)}"
    )
    for part in (_endpoints(status), _nodes(status), _pools(status), _templates(status)):
        console.print()
        console.print(part)
    console.print()
    counts = ", ".join(f"{n} {phase}" for phase, n in status.sandboxes.items())
    console.print(
        f"sandboxes: {sum(status.sandboxes.values())}" + (f" ({counts})" if counts else "")
    )


def _table(*columns: str, right: tuple[str, ...] = ()) -> Table:
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, justify="right" if column in right else "left")
    return table


def _endpoints(status: FleetStatus) -> RenderableType:
    table = _table("ENDPOINT", "URL", "STATE")
    for endpoint in status.endpoints:
        state = "[green]up[/]" if endpoint.up else f"[bold red]down[/]: {endpoint.problem}"
        table.add_row(endpoint.name, endpoint.url, state)
    return table


_STATE_STYLE = {"fresh": "green", "stale": "bold red", "unstamped": "yellow", "ahead": "magenta"}


def _nodes(status: FleetStatus) -> RenderableType:
    table = _table("NODE", "ADDRESS", "STATE", "AGE", "SANDBOXES", "CAPACITY",
                   right=("AGE", "SANDBOXES", "CAPACITY"))  # fmt: skip
    for node in status.nodes:
        state = node.state.value
        table.add_row(
            node.node,
            node.address or "-",
            f"[{_STATE_STYLE.get(state, 'default')}]{state}[/]",
            format_duration(node.age) if node.age is not None else "-",
            str(node.sandboxes),
            str(node.capacity) if node.capacity is not None else "-",
        )
    for failed in status.unreached:
        table.add_row(
            "?", failed.address, f"[bold red]no answer[/]: {failed.reason}", "-", "-", "-"
        )
    if not status.nodes and not status.unreached:
        table.add_row("(no nodes)", "", "", "", "", "")
    return table


def _pools(status: FleetStatus) -> RenderableType:
    table = _table("POOL", "NODE", "WARM", "TARGET", right=("WARM", "TARGET"))
    for pool in status.pools:
        warm = str(pool.warm) if pool.warm >= pool.target else f"[yellow]{pool.warm}[/]"
        table.add_row(str(pool.key), pool.node, warm, str(pool.target))
    if not status.pools:
        table.add_row("(no warm pools)", "", "", "")
    return table


def _templates(status: FleetStatus) -> RenderableType:
    table = _table("TEMPLATE", "NODES", "BUILD", "SIZE", right=("SIZE",))
    for template in status.templates:
        size = template.size_bytes
        table.add_row(
            template.name,
            ", ".join(template.nodes),
            template.digest[:12] or "-",
            f"{size / 2**20:.1f} MiB" if size is not None else "-",
        )
    if not status.templates:
        table.add_row("(no templates)", "", "", "")
    return table


# --- --watch ---------------------------------------------------------------------------------


def _watch(
    source: StatusSource, rule: FreshnessRule, output: TableOrJson, interval: timedelta
) -> None:
    """Redraw every ``interval`` until Ctrl-C or SIGTERM, which end it with exit 0 like
    any long-lived verb's asked stop. A bad setup fails the first read in one line; a
    later read that fails is drawn as that frame, and the watch goes on."""
    from sandboxctl.cli.app import print_error
    from sandboxctl.cli.running import run_until_stopped
    from sandboxctl.core.errors import SandboxctlError
    from sandboxctl.inventory.status import collect_status
    from sandboxctl.lifecycle import Loop, Manager

    try:
        _draw(collect_status(source, rule, need_a_node=False), output, clear=True)
    except KeyboardInterrupt:
        return  # Ctrl-C ends a watch, even during its first read

    def redraw() -> None:
        try:
            status = collect_status(source, rule, need_a_node=False)
        except SandboxctlError as error:
            print_error(str(error))
            return
        _draw(status, output, clear=True)

    manager = Manager()
    manager.add(Loop("status redraw", redraw, interval, immediately=False, from_end=True))
    run_until_stopped(manager)

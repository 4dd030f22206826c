"""``sandboxctl status``: one view of a fleet (endpoints, nodes, pools, sandboxes,
templates), once or redrawn until Ctrl-C.

An operator runs it often, so its start counts: the flags are defined here rather than
taken from ``cli/options``, which loads the servers' stack (a quarter of a second), and
what reads the fleet is imported only when the command runs."""

from __future__ import annotations

import enum
import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sandboxctl.core.durations import format_duration, parse_duration
from sandboxctl.core.errors import ConfigurationError, InvalidValueError
from sandboxctl.core.freshness import DEFAULT_STALE_AFTER, FreshnessRule

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.table import Table

    from sandboxctl.core.status import FleetStatus
    from sandboxctl.inventory.status import StatusSource

DEFAULT_STATE_DIR = Path(".sandboxctl")  # serve's default --state-dir
DEFAULT_INTERVAL = timedelta(seconds=2)


class From(enum.StrEnum):
    STATE = "state"
    MESH = "mesh"
    KUBE = "kube"


class Output(enum.StrEnum):
    TABLE = "table"
    JSON = "json"


def _duration(value: str | timedelta) -> timedelta:
    if isinstance(value, timedelta):
        return value
    try:
        return parse_duration(value)
    except InvalidValueError as error:
        raise typer.BadParameter(str(error)) from None


def status(
    source: Annotated[
        From,
        typer.Option(
            "--source",
            case_sensitive=False,
            help="state: the fleet serve runs over --state-dir. mesh: ask the agents "
            "(--sandboxd-seeds). kube: the NodeInventory objects (--kubeconfig).",
        ),
    ] = From.STATE,
    state_dir: Annotated[
        Path,
        typer.Option("--state-dir", metavar="DIR", help="serve's state dir (--source state)."),
    ] = DEFAULT_STATE_DIR,
    seeds: Annotated[
        str,
        typer.Option(
            "--sandboxd-seeds",
            metavar="HOST:PORT,...",
            help="The sandboxd agents to ask (mesh), comma-separated. With --source state: "
            "serve's agent, when serve was given another --sandboxd-port than 7777.",
        ),
    ] = "",
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--sandboxd-token-file",
            help="File holding the fleet's root token for the agents (mesh). Without it "
            "only development agents (no token) answer.",
        ),
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            "--kubeconfig",
            metavar="FILE",
            help="The Kubernetes API whose NodeInventory objects to read (kube). Default: "
            "the pod's service account in a pod, else $KUBECONFIG or ~/.kube/config.",
        ),
    ] = None,
    stale_after: Annotated[
        timedelta,
        typer.Option(
            "--inventory-stale-after",
            "--stale-after",
            parser=_duration,
            metavar="DURATION",
            help="Judge a node stale whose publish trails the newest by more than this.",
            show_default=format_duration(DEFAULT_STALE_AFTER),
        ),
    ] = DEFAULT_STALE_AFTER,
    output: Annotated[
        Output, typer.Option("--output", "-o", help="table or json.", case_sensitive=False)
    ] = Output.TABLE,
    watch: Annotated[
        bool,
        typer.Option("--watch", "-w", help="Read and redraw every --interval until Ctrl-C."),
    ] = False,
    interval: Annotated[
        timedelta,
        typer.Option(
            "--interval",
            parser=_duration,
            metavar="DURATION",
            help="How often --watch reads the fleet again.",
            show_default=format_duration(DEFAULT_INTERVAL),
        ),
    ] = DEFAULT_INTERVAL,
) -> None:
    """Show a fleet at a glance: its endpoints, nodes, warm pools, sandboxes and templates."""
    _without_httpx_cli()
    from sandboxctl.inventory.status import collect_status

    chosen = _source(source, state_dir, seeds, token_file, kubeconfig)
    rule = FreshnessRule(stale_after=stale_after).validate()
    if interval <= timedelta(0):
        raise ConfigurationError(f"--interval must be positive, got {format_duration(interval)}")
    if not watch:
        _draw(collect_status(chosen, rule), output, clear=False)
        return
    _watch(chosen, rule, output, interval)


def _without_httpx_cli() -> None:
    """Keep httpx's own command line out of this process. httpx imports it whenever click,
    rich and pygments are installed (they are, with typer): a third of this verb's start,
    for a program sandboxctl never runs. Without it httpx defines a stand-in."""
    if "httpx" not in sys.modules:
        sys.modules["httpx._main"] = None  # type: ignore[assignment]  # import stops here


def _source(
    source: From, state_dir: Path, seeds: str, token_file: Path | None, kubeconfig: Path | None
) -> StatusSource:
    """What the flags name (one line, exit 2 when they do not fit together)."""
    from sandboxctl.inventory.live import parse_seeds
    from sandboxctl.inventory.status import FromAgents, FromKube, FromStateDir

    addresses = parse_seeds(seeds)
    if kubeconfig is not None and source is not From.KUBE:
        raise ConfigurationError(f"--kubeconfig is for --source kube, not {source}")
    if token_file is not None and source is not From.MESH:
        raise ConfigurationError(
            "--sandboxd-token-file is for --source mesh (serve's state dir holds its token)"
            if source is From.STATE
            else "--sandboxd-token-file is for --source mesh"
        )
    if source is From.KUBE:
        if addresses:
            raise ConfigurationError("--sandboxd-seeds is for --source mesh or state")
        return FromKube(kubeconfig)
    if source is From.MESH:
        if not addresses:
            raise ConfigurationError("--source mesh needs --sandboxd-seeds HOST:PORT[,...]")
        from sandboxctl.secretfiles import read_secret

        token = read_secret("--sandboxd-token-file", token_file) if token_file else None
        return FromAgents(addresses, token)
    return FromStateDir(state_dir, addresses)


# --- drawing -----------------------------------------------------------------------------


def _draw(status: FleetStatus, output: Output, clear: bool) -> None:
    if output is Output.JSON:
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


def _watch(source: StatusSource, rule: FreshnessRule, output: Output, interval: timedelta) -> None:
    """Redraw every ``interval`` until Ctrl-C or SIGTERM, which end it with exit 0 like
    any long-lived verb's asked stop. A bad setup fails the first read in one line; a
    later read that fails is drawn as that frame, and the watch goes on."""
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
            typer.echo(f"sandboxctl: error: {' '.join(str(error).split())}", err=True)
            return
        _draw(status, output, clear=True)

    manager = Manager()
    manager.add(Loop("status redraw", redraw, interval, immediately=False, from_end=True))
    run_until_stopped(manager)

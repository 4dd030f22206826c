"""``sandboxctl publish``: this host's NodeInventory, server-side applied every interval."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer

from sandboxctl.agentapi.client import AgentClient
from sandboxctl.cli.addresses import parse_listen
from sandboxctl.cli.options import Kubeconfig, parse_duration_flag, service_logging
from sandboxctl.cli.running import run_until_stopped
from sandboxctl.core.durations import format_duration
from sandboxctl.core.errors import ConfigurationError
from sandboxctl.lifecycle import Manager
from sandboxctl.secretfiles import read_secret

EXIT_NOT_PUBLISHED = 1
DEFAULT_INTERVAL = timedelta(seconds=30)  # publisher.publish.DEFAULT_INTERVAL, without its imports


def publish(
    node: Annotated[
        str,
        typer.Option("--node", metavar="NAME", help="This host's node name (the agent's --node)."),
    ],
    sandboxd: Annotated[
        str,
        typer.Option("--sandboxd", metavar="URL", help="The host agent to read."),
    ] = "http://127.0.0.1:7777",
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--sandboxd-token-file",
            metavar="FILE",
            help="The agent's root token. Without it only a development agent answers.",
        ),
    ] = None,
    kubeconfig: Kubeconfig = None,
    interval: Annotated[
        timedelta,
        typer.Option(
            "--interval",
            parser=parse_duration_flag,
            metavar="DURATION",
            help="How often to publish (the readers' --publish-interval).",
            show_default=format_duration(DEFAULT_INTERVAL),
        ),
    ] = DEFAULT_INTERVAL,
    no_stamp: Annotated[
        bool,
        typer.Option(
            "--no-stamp",
            help="Publish without publishedAt, as an old publisher does: readers never "
            "judge this node stale.",
        ),
    ] = False,
    once: Annotated[
        bool,
        typer.Option(
            "--once",
            help=f"Publish once and exit (cron): 0 when applied, {EXIT_NOT_PUBLISHED} when not.",
        ),
    ] = False,
    metrics_listen: Annotated[
        str,
        typer.Option(
            "--metrics-listen",
            metavar="HOST:PORT",
            help="Serve /metrics here (not with --once); port 0 picks one.",
        ),
    ] = "127.0.0.1:9465",
) -> None:
    """Publish this host's NodeInventory: read the agent, server-side apply the object with
    publishedAt every interval. Applies nothing while the agent cannot be read; never
    deletes."""
    # Loaded here: the Kubernetes client costs every other command's start otherwise.
    from sandboxctl.kube import NODE_INVENTORIES, CustomObjects, api_client
    from sandboxctl.publisher import Outcome, Publisher, PublishMetrics

    log = service_logging("sandboxctl.publish")
    if not node:
        raise ConfigurationError("--node NAME is required")
    if interval <= timedelta(0):
        raise ConfigurationError(f"--interval must be positive, got {format_duration(interval)}")
    token = read_secret("--sandboxd-token-file", token_file) if token_file else None
    host, port = parse_listen("--metrics-listen", metrics_listen)
    api = api_client(kubeconfig)
    agent = AgentClient(sandboxd, token, timeout=min(10.0, interval.total_seconds()))
    metrics = PublishMetrics()
    publisher = Publisher(
        node,
        agent,
        CustomObjects(api, NODE_INVENTORIES),
        interval=interval,
        stamp=not no_stamp,
        metrics=metrics,
    )
    try:
        if once:
            result = publisher.publish()
            if result.outcome is not Outcome.PUBLISHED:
                typer.echo(f"sandboxctl: published nothing: {result.reason}", err=True)
                raise typer.Exit(EXIT_NOT_PUBLISHED)
            return
        bound = metrics.serve(host, port)
        log.info(
            "publishing node %s from %s every %s%s; metrics on http://%s:%d/metrics",
            node,
            sandboxd,
            format_duration(interval),
            " without publishedAt (--no-stamp)" if no_stamp else "",
            host,
            bound,
        )
        manager = Manager()
        manager.add(publisher)
        run_until_stopped(manager)
        log.info("stopped; the NodeInventory of %s is left in place", node)
    finally:
        metrics.close()
        agent.close()
        api.close()  # type: ignore[no-untyped-call]

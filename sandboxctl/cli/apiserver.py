"""``sandboxctl serve-apiserver``: the Kubernetes-style Sandbox API over the fleet."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer

from sandboxctl.apiserver.kube import create_kube_app
from sandboxctl.apiserver.kubeconfig import server_url, write_kubeconfig
from sandboxctl.cli.addresses import parse_listen
from sandboxctl.cli.options import (
    PublishInterval,
    Reference,
    StaleAfter,
    freshness_rule,
    parse_duration_flag,
    read_token,
)
from sandboxctl.core.durations import format_duration
from sandboxctl.core.errors import ConfigurationError, InvalidValueError
from sandboxctl.core.freshness import DEFAULT_PUBLISH_INTERVAL, DEFAULT_STALE_AFTER, ReferenceMode
from sandboxctl.inventory.mesh import DEFAULT_POLL_INTERVAL, MeshInventorySource
from sandboxctl.serving import bind, run_server
from sandboxctl.store import SandboxStore
from sandboxctl.store.nodes import NodeAccess

SOURCES = ("mesh",)


def serve_apiserver(
    source: Annotated[
        str,
        typer.Option(
            "--source",
            metavar="mesh",
            help="Where inventories come from. mesh: poll the sandboxd agents directly.",
        ),
    ] = "mesh",
    seeds: Annotated[
        str,
        typer.Option(
            "--sandboxd-seeds",
            metavar="HOST:PORT,...",
            help="The sandboxd agents to poll (mesh), comma-separated.",
        ),
    ] = "",
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--sandboxd-token-file",
            help="File holding the fleet's root token for the agents. Without it only "
            "development agents (no token) can be read and claimed from.",
        ),
    ] = None,
    inventory_poll: Annotated[
        timedelta,
        typer.Option(
            "--inventory-poll",
            parser=parse_duration_flag,
            metavar="DURATION",
            help="How often mesh mode polls every agent.",
            show_default=format_duration(DEFAULT_POLL_INTERVAL),
        ),
    ] = DEFAULT_POLL_INTERVAL,
    stale_after: StaleAfter = DEFAULT_STALE_AFTER,
    reference: Reference = ReferenceMode.PUBLISH,
    publish_interval: PublishInterval = DEFAULT_PUBLISH_INTERVAL,
    listen: Annotated[
        str, typer.Option("--listen", metavar="HOST:PORT", help="Address to serve the API on.")
    ] = "127.0.0.1:3002",
    kubeconfig_out: Annotated[
        Path | None,
        typer.Option(
            "--kubeconfig-out",
            metavar="FILE",
            help="Write a kubeconfig for this server here (mode 0600), for kubectl --kubeconfig.",
        ),
    ] = None,
) -> None:
    """Serve sandboxes.agents.x-k8s.io/v1beta1 (list, get, watch, create, delete) for kubectl."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per inventory poll
    log = logging.getLogger("sandboxctl.apiserver")
    if source not in SOURCES:
        raise InvalidValueError(
            f"--source {source!r}: only mesh is supported for now (poll the agents given "
            "by --sandboxd-seeds)"
        )
    host, port = parse_listen("--listen", listen)
    addresses = [seed.strip() for seed in seeds.split(",") if seed.strip()]
    if not addresses:
        raise ConfigurationError("--source mesh needs --sandboxd-seeds HOST:PORT[,HOST:PORT...]")
    rule = freshness_rule(stale_after, reference, publish_interval)
    for warning in rule.warnings():
        log.warning("freshness: %s", warning)
    token = read_token("--sandboxd-token-file", token_file) if token_file else None
    if token is None:
        log.warning("no --sandboxd-token-file: only development agents (no token) will answer")

    inventories = MeshInventorySource(addresses, token, poll_interval=inventory_poll)
    with bind(host, port) as sock:  # a taken port fails before any agent is polled
        port = sock.getsockname()[1]  # --listen HOST:0 picked one
        inventories.start()  # one line and exit 2 when no seed answers or refuses the token
        store = SandboxStore(inventories, rule, nodes=NodeAccess(token))
        try:
            if kubeconfig_out is not None:
                write_kubeconfig(kubeconfig_out, server_url(host, port))
                log.info("wrote a kubeconfig for kubectl to %s", kubeconfig_out)
            log.info(
                "serving the Sandbox API on %s over %d agents",
                server_url(host, port),
                len(addresses),
            )
            # run_server has no shutdown hook, but the first thing uvicorn's shutdown does
            # is close the listening socket: open watches end then, so a stop signal is
            # not held up for as long as a watch may last (kubectl asks for 5 to 10 min).
            app = create_kube_app(store, stopping=lambda: sock.fileno() == -1)
            run_server(app, sock)
        finally:
            inventories.stop()
            store.close()

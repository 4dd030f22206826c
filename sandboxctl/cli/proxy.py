"""``sandboxctl serve-proxy``: the envd proxy (the e2b data plane) over the fleet.

It reads inventories like ``serve-apiserver`` (mesh: poll the agents), resolves each
sandbox to its owning node, checks the caller's envd access token and relays envd
traffic to that node's agent. See docs/envd-proxy.md."""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer

from sandboxctl.apiserver.kubeconfig import server_url
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
from sandboxctl.proxy import create_proxy_app
from sandboxctl.serving import bind, run_servers
from sandboxctl.store import SandboxStore
from sandboxctl.store.nodes import NodeAccess

SOURCES = ("mesh",)


def serve_proxy(
    domain: Annotated[
        str,
        typer.Option(
            "--domain",
            metavar="DOMAIN",
            help="The sandbox domain (must equal the e2b API's --e2b-domain): hosts "
            "{port}-{id}.DOMAIN are routed.",
        ),
    ] = "",
    secret_file: Annotated[
        Path | None,
        typer.Option(
            "--e2b-envd-secret-file",
            metavar="FILE",
            help="The e2b API's envd secret: X-Access-Token must equal "
            "HMAC-SHA256(secret, claim token).",
        ),
    ] = None,
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
            "development agents (no token) answer.",
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
        str, typer.Option("--listen", metavar="HOST:PORT", help="Address to serve envd on.")
    ] = "127.0.0.1:3001",
) -> None:
    """Serve the envd proxy: route e2b envd traffic to the node that owns each sandbox.
    Cleartext HTTP only; put TLS in front of it."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per inventory poll
    log = logging.getLogger("sandboxctl.proxy")
    if source not in SOURCES:
        raise InvalidValueError(
            f"--source {source!r}: only mesh is supported for now (poll the agents given "
            "by --sandboxd-seeds)"
        )
    if not domain.strip("."):
        raise ConfigurationError("serve-proxy needs --domain (the e2b API's --e2b-domain)")
    if secret_file is None:
        raise ConfigurationError(
            "serve-proxy needs --e2b-envd-secret-file (the e2b API's envd secret)"
        )
    secret = read_token("--e2b-envd-secret-file", secret_file).encode()
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
    with contextlib.ExitStack() as sockets:
        sock = sockets.enter_context(bind(host, port))  # a taken port fails first
        port = sock.getsockname()[1]  # --listen HOST:0 picked one
        inventories.start()  # one line and exit 2 when no seed answers or refuses the token
        store = SandboxStore(inventories, rule, nodes=NodeAccess(token))
        try:
            log.info(
                "serving the envd proxy on %s for *.%s over %d agents",
                server_url(host, port),
                domain.strip("."),
                len(addresses),
            )
            run_servers([(create_proxy_app(store, secret, domain.strip(".")), sock)])
        finally:
            inventories.stop()
            store.close()

"""``sandboxctl serve-proxy``: the envd proxy (the e2b data plane) over the fleet.

It reads inventories like ``serve-apiserver`` (mesh: poll the agents), resolves each
sandbox to its owning node, checks the caller's envd access token and relays envd
traffic to that node's agent. See docs/envd-proxy.md."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sandboxctl.apiserver.kubeconfig import server_url
from sandboxctl.cli.addresses import parse_listen
from sandboxctl.cli.options import (
    BODY_IDLE_TIMEOUT,
    HEAD_TIMEOUT,
    MaxConnections,
    PublishInterval,
    Reference,
    RequestBodyIdleTimeout,
    RequestHeadTimeout,
    StaleAfter,
    freshness_rule,
    read_bounds,
    service_logging,
)
from sandboxctl.cli.running import run_until_stopped
from sandboxctl.cli.sources import (
    DEFAULT_POLL_INTERVAL,
    InventoryPoll,
    Kubeconfig,
    SandboxdTokenFile,
    Seeds,
    Source,
    fleet_source,
)
from sandboxctl.core.errors import ConfigurationError
from sandboxctl.core.freshness import DEFAULT_PUBLISH_INTERVAL, DEFAULT_STALE_AFTER, ReferenceMode
from sandboxctl.lifecycle import Group, Manager
from sandboxctl.proxy import create_proxy_app
from sandboxctl.secretfiles import read_secret
from sandboxctl.serving import Served, bind
from sandboxctl.serving.bounds import DEFAULT_MAX_CONNECTIONS


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
    source: Source = "mesh",
    seeds: Seeds = "",
    token_file: SandboxdTokenFile = None,
    kubeconfig: Kubeconfig = None,
    inventory_poll: InventoryPoll = DEFAULT_POLL_INTERVAL,
    stale_after: StaleAfter = DEFAULT_STALE_AFTER,
    reference: Reference = ReferenceMode.PUBLISH,
    publish_interval: PublishInterval = DEFAULT_PUBLISH_INTERVAL,
    listen: Annotated[
        str, typer.Option("--listen", metavar="HOST:PORT", help="Address to serve envd on.")
    ] = "127.0.0.1:3001",
    request_head_timeout: RequestHeadTimeout = HEAD_TIMEOUT,
    request_body_idle_timeout: RequestBodyIdleTimeout = BODY_IDLE_TIMEOUT,
    max_connections: MaxConnections = DEFAULT_MAX_CONNECTIONS,
) -> None:
    """Serve the envd proxy: route e2b envd traffic to the node that owns each sandbox.
    Cleartext HTTP only; put TLS in front of it."""
    log = service_logging("sandboxctl.proxy")
    if not domain.strip("."):
        raise ConfigurationError("serve-proxy needs --domain (the e2b API's --e2b-domain)")
    if secret_file is None:
        raise ConfigurationError(
            "serve-proxy needs --e2b-envd-secret-file (the e2b API's envd secret)"
        )
    secret = read_secret("--e2b-envd-secret-file", secret_file).encode()
    host, port = parse_listen("--listen", listen)
    bounds = read_bounds(request_head_timeout, request_body_idle_timeout, max_connections)
    rule = freshness_rule(stale_after, reference, publish_interval, log=log)
    mesh = fleet_source(
        source, seeds, token_file, inventory_poll, kubeconfig, publish_interval, log
    )
    with bind(host, port) as sock, mesh.store(rule) as store:  # a taken port fails first
        port = sock.getsockname()[1]  # --listen HOST:0 picked one
        log.info(
            "serving the envd proxy on %s for *.%s over %s",
            server_url(host, port),
            domain.strip("."),
            mesh.description,
        )
        app = create_proxy_app(store, secret, domain.strip("."))
        manager = Manager()
        manager.add(Served([(app, sock)], loop="uvloop", bounds=bounds), Group.SERVERS)
        run_until_stopped(manager)

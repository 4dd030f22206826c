"""``sandboxctl serve``: a whole one-host development fleet in one process, no
configuration (sandboxctl/fleet). See docs/serve.md and docs/envd-proxy.md."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer

from sandboxctl.cli.options import (
    BODY_IDLE_TIMEOUT,
    HEAD_TIMEOUT,
    MaxConnections,
    PublishInterval,
    Recover,
    Reference,
    RequestBodyIdleTimeout,
    RequestHeadTimeout,
    RuntimeRoot,
    SandboxCidr,
    SandboxDns,
    StaleAfter,
    TemplateStoreDir,
    freshness_rule,
    parse_pool_flag,
    read_bounds,
    service_logging,
)
from sandboxctl.core.freshness import (
    DEFAULT_PUBLISH_INTERVAL,
    DEFAULT_STALE_AFTER,
    ReferenceMode,
)
from sandboxctl.core.statedir import DEFAULT_STATE_DIR
from sandboxctl.core.templates import DEFAULT_TEMPLATE, HOST_ROOT
from sandboxctl.fleet import DEFAULT_DOMAIN, Fleet, Ports, run_fleet
from sandboxctl.fleet.run import refuse_state_dir_in_use
from sandboxctl.fleet.template import check_template
from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime
from sandboxctl.sandboxd.network.sandboxes import AUTO
from sandboxctl.sandboxd.runtimedir import DEFAULT_RUNTIME_ROOT, check_root, prepare, runtime_dir
from sandboxctl.sandboxd.templates.store import DEFAULT_STORE, check_store
from sandboxctl.serving import bind
from sandboxctl.serving.bounds import DEFAULT_MAX_CONNECTIONS

WARM = 2  # the default pool: this many warm sandboxes of --template


def serve(
    state_dir: Annotated[
        Path,
        typer.Option(
            "--state-dir",
            help="Where the fleet keeps its keys, tokens, kubeconfig and sandbox state "
            "(created 0700 on first start), and a 'runtime' link to the rest.",
        ),
    ] = DEFAULT_STATE_DIR,
    host: Annotated[
        str, typer.Option("--host", help="Address every API listens on and is reached at.")
    ] = "127.0.0.1",
    e2b_port: Annotated[
        int, typer.Option("--e2b-port", min=0, max=65535, help="Port of the e2b REST API.")
    ] = 3000,
    proxy_port: Annotated[
        int,
        typer.Option(
            "--proxy-port",
            min=0,
            max=65535,
            help="Port of the envd proxy (E2B_SANDBOX_URL names it): sandbox commands and "
            "files go through it to the host agent's envd.",
        ),
    ] = 3001,
    kube_port: Annotated[
        int,
        typer.Option("--kube-port", min=0, max=65535, help="Port of the Kubernetes-style API."),
    ] = 3002,
    sandboxd_port: Annotated[
        int,
        typer.Option(
            "--sandboxd-port", min=0, max=65535, help="Port of the host agent's HTTP API."
        ),
    ] = 7777,
    metrics_port: Annotated[
        int,
        typer.Option(
            "--metrics-port",
            min=0,
            max=65535,
            help="Port of the /metrics of the e2b API and the Kubernetes-style API, on "
            "127.0.0.1 only (0: a free one, shown at start).",
        ),
    ] = 0,
    pool: Annotated[
        list[str] | None,
        typer.Option(
            "--pool",
            metavar="TEMPLATE[/NET[/SIZE]]=N",
            help="Keep N warm sandboxes of this pool key (repeatable; default: "
            f"{WARM} of --template, e.g. {DEFAULT_TEMPLATE}={WARM}).",
        ),
    ] = None,
    max_sandboxes: Annotated[
        int, typer.Option("--max-sandboxes", min=1, help="Most sandboxes alive at once.")
    ] = 16,
    uid_base: Annotated[
        int, typer.Option("--uid-base", min=1000, help="First host uid given to sandboxes.")
    ] = 200_000,
    domain: Annotated[
        str,
        typer.Option(
            "--e2b-domain", help="The domain the e2b API reports for sandboxes (sandbox hosts)."
        ),
    ] = DEFAULT_DOMAIN,
    keep_sandboxes: Annotated[
        bool,
        typer.Option(
            "--keep-sandboxes",
            help="Leave sandboxes running on exit (the next start adopts them). "
            "Default: destroy them all.",
        ),
    ] = False,
    template: Annotated[
        str,
        typer.Option(
            "--template",
            metavar="NAME",
            help=f"What sandboxes run from (the warm pool, and the e2b SDK's default). "
            f"{DEFAULT_TEMPLATE}: built from Debian packages on the first start, into "
            f"--template-store; sandboxes do not see the host's files. {HOST_ROOT}: the "
            "host's root filesystem, read-only (sandboxes see the host's files). Any other: "
            "a template in --template-store.",
        ),
    ] = DEFAULT_TEMPLATE,
    template_store: TemplateStoreDir = DEFAULT_STORE,
    runtime_root: RuntimeRoot = DEFAULT_RUNTIME_ROOT,
    recover: Recover = False,
    sandbox_cidr: SandboxCidr = AUTO,
    sandbox_dns: SandboxDns = "host",
    stale_after: StaleAfter = DEFAULT_STALE_AFTER,
    reference: Reference = ReferenceMode.PUBLISH,
    publish_interval: PublishInterval = DEFAULT_PUBLISH_INTERVAL,
    request_head_timeout: RequestHeadTimeout = HEAD_TIMEOUT,
    request_body_idle_timeout: RequestBodyIdleTimeout = BODY_IDLE_TIMEOUT,
    max_connections: MaxConnections = DEFAULT_MAX_CONNECTIONS,
) -> None:
    """Run a whole one-host development fleet: agent, Kubernetes-style API, e2b API and
    envd proxy."""
    log = service_logging("sandboxctl.serve")
    bounds = read_bounds(request_head_timeout, request_body_idle_timeout, max_connections)
    pools = dict(parse_pool_flag(text) for text in pool or (f"{template}={WARM}",))
    rule = freshness_rule(stale_after, reference, publish_interval, log=log)
    BubblewrapRuntime.check()  # root, the host tools, user namespaces: one line, exit 2
    state_dir = state_dir.absolute()
    check_root(runtime_root)  # sandbox uids reach their homes there; the state dir is private
    check_store(template_store, "--template-store")  # and the templates' roots
    check_template(template, pools, template_store)
    # Then whether another agent holds the state dir (probed, never taken here), and only
    # then the ports: each refusal names its own cause and leaves every file as it was.
    refuse_state_dir_in_use(state_dir, runtime_dir(state_dir, runtime_root))

    # Every port next: a taken one fails at once, before anything starts or is written.
    with contextlib.ExitStack() as bound:
        sockets = [
            bound.enter_context(bind(host, port))
            for port in (sandboxd_port, kube_port, e2b_port, proxy_port)
        ]
        # Loopback whatever --host says: the fleet's figures are the operator's.
        sockets.append(bound.enter_context(bind("127.0.0.1", metrics_port)))
        fleet = Fleet(
            state_dir=state_dir,
            host=host,
            ports=Ports(*(sock.getsockname()[1] for sock in sockets)),
            pools=pools,
            max_sandboxes=max_sandboxes,
            uid_base=uid_base,
            domain=domain,
            keep_sandboxes=keep_sandboxes,
            recover=recover,
            runtime_root=runtime_root,
            sandbox_cidr=sandbox_cidr,
            sandbox_dns=sandbox_dns,
            template=template,
            template_store=template_store,
            bounds=bounds,
        )
        # The runtime dir is this start's from here on, a first start's build included:
        # no other start collects it while serve starts or runs (runtimedir.py).
        bound.enter_context(prepare(fleet.runtime))
        code = run_fleet(fleet, rule, sockets)
    if code:
        raise typer.Exit(code)

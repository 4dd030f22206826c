"""``sandboxctl serve-sandboxd``: the host agent."""

from __future__ import annotations

import enum
import functools
import logging
import socket
from pathlib import Path
from typing import Annotated

import typer

from sandboxctl.cli.addresses import join_host_port, parse_listen
from sandboxctl.cli.options import (
    BODY_IDLE_TIMEOUT,
    HEAD_TIMEOUT,
    MaxConnections,
    Recover,
    RequestBodyIdleTimeout,
    RequestHeadTimeout,
    RuntimeRoot,
    SandboxCidr,
    SandboxDns,
    TemplateStoreDir,
    parse_pool_flag,
    read_bounds,
    service_logging,
)
from sandboxctl.core.errors import ConfigurationError, InvalidValueError
from sandboxctl.sandboxd.agent import Agent, AgentSettings
from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime
from sandboxctl.sandboxd.network.sandboxes import AUTO, sandbox_network
from sandboxctl.sandboxd.recovery import recover_agent
from sandboxctl.sandboxd.runtime import Runtime
from sandboxctl.sandboxd.runtimedir import (
    DEFAULT_RUNTIME_ROOT,
    check_reach,
    check_root,
    collect_gone,
    link,
    prepare,
    runtime_dir,
    traversal_problem,
)
from sandboxctl.sandboxd.server import serve
from sandboxctl.sandboxd.templates.store import DEFAULT_STORE, check_store
from sandboxctl.sandboxd.unsafe import WARNING as UNSAFE_WARNING
from sandboxctl.sandboxd.unsafe import UnsafeProcessRuntime
from sandboxctl.secretfiles import read_secret
from sandboxctl.serving import bind
from sandboxctl.serving.bounds import DEFAULT_MAX_CONNECTIONS


class RuntimeName(enum.StrEnum):
    BUBBLEWRAP = "bubblewrap"
    UNSAFE_PROCESS = "unsafe-process"


def serve_sandboxd(
    node: Annotated[
        str, typer.Option("--node", help="This node's name (default: the host name).")
    ] = "",
    listen: Annotated[
        str, typer.Option("--listen", metavar="HOST:PORT", help="Address to serve the API on.")
    ] = "127.0.0.1:7777",
    advertise_addr: Annotated[
        str,
        typer.Option(
            "--advertise-addr",
            metavar="HOST:PORT",
            help="Address other components reach this agent at (default: --listen).",
        ),
    ] = "",
    state_dir: Annotated[
        Path,
        typer.Option(
            "--state-dir",
            help="Where the sandbox state lives (private; a 'runtime' link in it names "
            "the directory of the sandbox homes).",
        ),
    ] = Path("/var/lib/sandboxctl/sandboxd"),
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            help="File holding the root token. Without it: development mode, loopback only.",
        ),
    ] = None,
    pool: Annotated[
        list[str] | None,
        typer.Option(
            "--pool",
            metavar="TEMPLATE[/NET[/SIZE]]=N",
            help="Keep N warm sandboxes of this pool key (repeatable), e.g. base=4.",
        ),
    ] = None,
    max_sandboxes: Annotated[
        int, typer.Option("--max-sandboxes", min=1, help="Most sandboxes alive at once.")
    ] = 64,
    template: Annotated[
        list[str] | None,
        typer.Option(
            "--template",
            metavar="NAME=DIR",
            help="Serve template NAME with DIR as its read-only root (repeatable). "
            "'base' is the host root.",
        ),
    ] = None,
    runtime: Annotated[
        RuntimeName,
        typer.Option(
            "--runtime",
            help="bubblewrap: namespaces, a read-only root, per-sandbox uid and limits. "
            "unsafe-process: plain processes with NO isolation, for development only.",
        ),
    ] = RuntimeName.BUBBLEWRAP,
    destroy_on_exit: Annotated[
        bool,
        typer.Option("--destroy-on-exit", help="Destroy every sandbox on SIGTERM."),
    ] = False,
    uid_base: Annotated[
        int, typer.Option("--uid-base", min=1000, help="First host uid given to sandboxes.")
    ] = 200_000,
    runtime_root: RuntimeRoot = DEFAULT_RUNTIME_ROOT,
    template_store: TemplateStoreDir = DEFAULT_STORE,
    recover: Recover = False,
    sandbox_cidr: SandboxCidr = AUTO,
    sandbox_dns: SandboxDns = "host",
    request_head_timeout: RequestHeadTimeout = HEAD_TIMEOUT,
    request_body_idle_timeout: RequestBodyIdleTimeout = BODY_IDLE_TIMEOUT,
    max_connections: MaxConnections = DEFAULT_MAX_CONNECTIONS,
) -> None:
    """Run the host agent: isolated sandboxes with warm pools and leases."""
    log = service_logging("sandboxctl.sandboxd")
    host, port = parse_listen("--listen", listen)
    bounds = read_bounds(request_head_timeout, request_body_idle_timeout, max_connections)
    token = read_secret("--token-file", token_file) if token_file else None
    if token is None:
        if not _is_loopback(host):
            raise ConfigurationError(
                f"--listen {listen}: without --token-file the agent serves loopback only"
            )
        log.warning("DEVELOPMENT MODE: no --token-file, every request is trusted (loopback only)")
    templates = dict(_template(text) for text in template or ())
    pools = dict(parse_pool_flag(text) for text in pool or ())
    sandboxes = _runtime(runtime)
    # The state dir stays private; what sandbox uids reach goes to the runtime dir.
    check_root(runtime_root)
    check_store(template_store, "--template-store")  # sandbox uids bind its roots
    layout = runtime_dir(state_dir, runtime_root)
    # A taken port fails before anything is written; the owner lock is held from before
    # the runtime dir is first written until the agent has stopped (runtimedir.py).
    with bind(host, port) as sock, prepare(layout):
        link(layout)
        check_reach(layout, uid_base)  # what modes alone do not tell: one line, exit 2
        log.info("sandbox homes in %s (%s points to it)", layout.homes, layout.link)
        settings = AgentSettings(
            node=node or socket.gethostname(),
            advertise_addr=advertise_addr or join_host_port(host, port),
            state_dir=state_dir,
            templates=templates,
            template_store=template_store,
            max_sandboxes=max_sandboxes,
            pools=pools,
            uid_base=uid_base,
            runtime_dir=layout.path,
            uid_claims=layout.uids,
        )
        if recover:
            recover_agent(settings, sandboxes)
        network = None
        if sandboxes.isolated:  # the unsafe runtime has no namespace to give a network to
            network = sandbox_network(layout.path.name, sandbox_cidr, sandbox_dns, layout.path)
        agent = Agent(settings, sandboxes, network=network)
        collect = functools.partial(collect_gone, layout)  # once the start has succeeded
        code = serve(agent, sock, token, destroy_on_exit, bounds, started=collect)
    if code:
        raise typer.Exit(code)


def _runtime(name: RuntimeName) -> Runtime:
    if name is RuntimeName.UNSAFE_PROCESS:
        logging.getLogger("sandboxctl.sandboxd").warning(UNSAFE_WARNING)
        return UnsafeProcessRuntime()
    BubblewrapRuntime.check()
    return BubblewrapRuntime()


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _template(text: str) -> tuple[str, Path]:
    name, eq, directory = text.partition("=")
    if not eq or not name or not directory:
        raise InvalidValueError(f"--template {text!r}: expected NAME=DIR")
    path = Path(directory)
    if not path.is_dir():
        raise InvalidValueError(f"--template {text!r}: {directory} is not a directory")
    problem = traversal_problem(path.resolve())
    if problem:  # bubblewrap binds it as the sandbox uid: every start would fail
        raise InvalidValueError(
            f"--template {text!r}: {problem}; keep templates where every uid may traverse"
        )
    return name, path.resolve()

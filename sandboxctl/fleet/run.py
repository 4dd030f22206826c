"""The one-host development fleet ``sandboxctl serve`` runs: one process holds the host
agent, its HTTP API, the mesh inventory over that one agent, the sandbox store, the
Kubernetes-style API, the e2b API and the envd proxy (all over the one store); every app
is served by one uvicorn server (``serving.Served``), under one process manager
(``lifecycle``). See docs/serve.md."""

from __future__ import annotations

import logging
import signal
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from sandboxctl.apiserver.e2b import E2bConfig, create_e2b_app
from sandboxctl.apiserver.kube import create_kube_app
from sandboxctl.apiserver.kubeconfig import server_url
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.model import PoolKey
from sandboxctl.core.templates import DEFAULT_TEMPLATE, HOST_ROOT
from sandboxctl.fleet.certificate import fleet_certificate
from sandboxctl.fleet.readiness import Readiness, say
from sandboxctl.fleet.state import (
    AGENT_DIR,
    ENV_FILE,
    KUBECONFIG_FILE,
    NAMESPACE,
    TOKEN_FILE,
    Secrets,
    prepare_state_dir,
    write_client_files,
)
from sandboxctl.fleet.template import aliases, prepare_template
from sandboxctl.inventory.mesh import MeshInventorySource
from sandboxctl.lifecycle import STOP_SIGNALS, Group, Manager
from sandboxctl.proxy import create_proxy_app
from sandboxctl.sandboxd import runtimedir
from sandboxctl.sandboxd.agent import Agent, AgentSettings
from sandboxctl.sandboxd.api import create_app as create_agent_app
from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime
from sandboxctl.sandboxd.network.sandboxes import AUTO, sandbox_network
from sandboxctl.sandboxd.recovery import recover_agent
from sandboxctl.sandboxd.runtimedir import (
    DEFAULT_RUNTIME_ROOT,
    LINK,
    RuntimeDir,
    check_reach,
    collect_gone,
    link,
    runtime_dir,
)
from sandboxctl.sandboxd.templates.store import DEFAULT_STORE
from sandboxctl.serving import Served, Tls
from sandboxctl.serving.bounds import ReadBounds
from sandboxctl.serving.metrics import MetricsListener
from sandboxctl.store import SandboxStore
from sandboxctl.store.nodes import NodeAccess

log = logging.getLogger("sandboxctl.serve")

DEFAULT_DOMAIN = "sandboxctl.local"
MESH_POLL = timedelta(seconds=1)


@dataclass(frozen=True, slots=True)
class Ports:
    sandboxd: int
    kube: int
    e2b: int
    proxy: int
    metrics: int = 0  # the e2b API's and the Sandbox API's /metrics, on 127.0.0.1


@dataclass(frozen=True, slots=True)
class Fleet:
    state_dir: Path
    host: str
    ports: Ports
    pools: Mapping[PoolKey, int] = field(default_factory=dict)
    max_sandboxes: int = 16
    uid_base: int = 200_000
    domain: str = DEFAULT_DOMAIN
    keep_sandboxes: bool = False
    recover: bool = False  # an unreadable agent state database: move it aside (recovery.py)
    runtime_root: Path = DEFAULT_RUNTIME_ROOT
    sandbox_cidr: str = AUTO
    sandbox_dns: str = "host"
    # What its sandboxes run from (template.py): "default" is built on the first start;
    # "base" is the host's root. Every template in the store is served besides.
    template: str = DEFAULT_TEMPLATE
    template_store: Path = DEFAULT_STORE
    bounds: ReadBounds = field(default_factory=ReadBounds)  # every listener's (serving)

    def url(self, port: int) -> str:
        return server_url(self.host, port)

    @property
    def kube_url(self) -> str:
        """The Sandbox API's: HTTPS, or kubectl would not send its token."""
        return server_url(self.host, self.ports.kube, tls=True)

    @property
    def runtime(self) -> RuntimeDir:
        """Where what sandbox uids reach is kept: the agent's homes (runtimedir.py)."""
        return runtime_dir(self.state_dir, self.runtime_root)

    @property
    def agent_addr(self) -> str:
        return self.url(self.ports.sandboxd).removeprefix("http://")


def refuse_state_dir_in_use(state_dir: Path, runtime: RuntimeDir) -> None:
    """StateDirInUse when a running agent holds ``state_dir``: a ``serve`` holds its
    runtime dir's owner lock, an agent (``serve``'s, or ``serve-sandboxd`` on its agent
    dir) its state lock (``runtimedir.refuse_state_dir_in_use``: probed, nothing made)."""
    runtimedir.refuse_state_dir_in_use(state_dir, runtime, state_dir / AGENT_DIR)


def run_fleet(fleet: Fleet, rule: FreshnessRule, sockets: list[socket.socket]) -> int:
    """Serve the fleet on ``sockets`` (bound, in the order agent, kube, e2b, proxy,
    metrics) until a stop signal; then stop every part, destroying the sandboxes unless
    asked not to.
    The exit code (the process manager's). The caller holds the owner lock of the
    fleet's runtime dir (``runtimedir.prepare``)."""
    template = prepare_template(fleet.template, fleet.template_store)  # first start: a build
    found = prepare_state_dir(fleet.state_dir)
    kube_tls = fleet_certificate(fleet.state_dir, fleet.host)
    runtime = fleet.runtime  # its owner lock is the caller's (cli/serve.py)
    link(runtime)
    check_reach(runtime, fleet.uid_base)
    if fleet.host not in ("localhost", "::1") and not fleet.host.startswith("127."):
        log.warning(
            "--host %s is not loopback: every API is plain HTTP, so its keys and tokens "
            "cross the network in clear (serve-apiserver --tls-cert-file serves HTTPS)",
            fleet.host,
        )
    settings = AgentSettings(
        node=socket.gethostname() or "local",
        advertise_addr=fleet.agent_addr,
        state_dir=fleet.state_dir / AGENT_DIR,
        max_sandboxes=fleet.max_sandboxes,
        pools=dict(fleet.pools),
        uid_base=fleet.uid_base,
        runtime_dir=runtime.path,
        uid_claims=runtime.uids,
        template_store=fleet.template_store,
        host_root=fleet.template == HOST_ROOT,
    )
    sandboxes = BubblewrapRuntime()
    if fleet.recover:
        recover_agent(settings, sandboxes)
    agent = Agent(
        settings,
        sandboxes,
        network=sandbox_network(
            runtime.path.name, fleet.sandbox_cidr, fleet.sandbox_dns, runtime.path
        ),
    )
    inventories = MeshInventorySource([fleet.agent_addr], found.root_token, MESH_POLL)
    store = SandboxStore(inventories, rule, nodes=NodeAccess(found.root_token))
    # A closed terminal stops the fleet like Ctrl-C (SIGHUP would end it at once and
    # leave every sandbox running).
    manager = Manager(signals=(*STOP_SIGNALS, signal.SIGHUP))
    with manager:  # from here a signal stops the fleet in order; a second one ends it
        try:
            agent.start()  # adopts what a --keep-sandboxes run left, and logs it
            collect_gone(runtime)  # the start has succeeded: a refused one changes nothing
            served = _served(fleet, found, kube_tls, agent, store, manager, sockets)
            manager.add(served, Group.SERVERS)
            for loop in agent.loops():  # stopped before the agent destroys anything
                manager.add(loop)
            write_client_files(fleet, found, kube_tls.cert_file)
            say(usage(fleet, template))
            manager.add(
                Readiness(fleet, agent, store, inventories, found.root_token, kube_tls.cert_file)
            )
            code = manager.run()
            log.info("stopping")
        finally:
            _stop_parts(fleet, agent, store, inventories)
    return code


def _served(
    fleet: Fleet,
    found: Secrets,
    kube_tls: Tls,
    agent: Agent,
    store: SandboxStore,
    manager: Manager,
    sockets: list[socket.socket],
) -> Served:
    """Every API of the fleet, on its socket: the agent's, the Sandbox API (HTTPS), the
    e2b API and the envd proxy over the same store (the SDK's envd calls)."""
    agent_sock, kube_sock, e2b_sock, proxy_sock, metrics_sock = sockets
    # The agent and the proxy serve their /metrics themselves; the two APIs' go to a
    # listener of their own, where a tenant's e2b key reads nothing of the fleet's.
    metrics = MetricsListener.on(metrics_sock)
    config = E2bConfig(
        domain=fleet.domain,
        envd_secret=found.envd_secret,
        api_keys=found.api_keys,
        namespace=NAMESPACE,
        aliases=aliases(fleet.template),
    )
    # Open watches end as soon as the stop begins, so they do not hold it up.
    # Both APIs read a template name alike: web.yaml's `image: base` is Sandbox.create()'s.
    kube_app = create_kube_app(
        store,
        found.kube_tokens,
        stopping=manager.stopping.is_set,
        aliases=config.aliases,
        times=metrics.times,
    )
    listeners: list[tuple[Any, socket.socket]] = [
        (create_agent_app(agent, found.root_token), agent_sock),
        (kube_app, kube_sock),
        (create_e2b_app(store, config, metrics.times), e2b_sock),
        (create_proxy_app(store, found.envd_secret, fleet.domain), proxy_sock),
    ]
    return metrics.served(listeners, kube_tls, fleet.bounds, tls_only=[kube_sock])


def _stop_parts(
    fleet: Fleet, agent: Agent, store: SandboxStore, inventories: MeshInventorySource
) -> None:
    inventories.stop()
    store.close()
    destroy = not fleet.keep_sandboxes
    agent.stop(destroy=destroy)
    log.info(
        "stopped; sandboxes %s",
        "destroyed" if destroy else "left running (--keep-sandboxes)",
    )


# --- what to tell the user ------------------------------------------------------------


def usage(fleet: Fleet, template: str) -> str:
    directory = _shown(fleet.state_dir)
    # The Python serve runs on has the SDK in a checkout (make serve installs it): the
    # snippets name it as the README does (.venv/bin/python), else a plain python.
    python, hint = (
        (_shown(Path(sys.executable)), "") if find_spec("e2b") else ("python", " (pip install e2b)")
    )
    lines = [
        "sandboxctl serve: a one-host development fleet",
        f"  e2b API         {fleet.url(fleet.ports.e2b)}",
        f"  Kubernetes API  {fleet.kube_url}",
        f"  sandboxd        {fleet.url(fleet.ports.sandboxd)}  (token in {directory}/{TOKEN_FILE})",
        f"  envd proxy      {fleet.url(fleet.ports.proxy)}  (sandbox commands and files)",
        f"  metrics         {server_url('127.0.0.1', fleet.ports.metrics)}/metrics  "
        "(the e2b API's and the Sandbox API's; sandboxd and the proxy serve their own)",
        f"  runtime dir     {fleet.runtime.path}  (sandbox homes; {directory}/{LINK})",
        f"  template        {template}",
        "",
        f"Use it with the e2b SDK{hint}:",
        f"  set -a; . {directory}/{ENV_FILE}; set +a",
        f"  {python} -c 'from e2b import Sandbox; s = Sandbox.create(); "
        "print(s.sandbox_id); s.kill()'",
        f"  {python} -c 'from e2b import Sandbox; s = Sandbox.create(); "
        'print(s.commands.run("echo hi").stdout, end=""); s.kill()\'',
        "and with kubectl:",
        f"  kubectl --kubeconfig {directory}/{KUBECONFIG_FILE} get sandboxes",
        "Stop with Ctrl-C (sandboxes are "
        + ("left running)" if fleet.keep_sandboxes else "destroyed; --keep-sandboxes keeps them)"),
    ]
    return "\n".join(lines)


def _shown(path: Path) -> str:
    """A path as the user would type it: relative when under the cwd."""
    try:
        relative = path.relative_to(Path.cwd())
    except ValueError:
        return str(path)
    return str(relative) if str(relative) != "." else "."

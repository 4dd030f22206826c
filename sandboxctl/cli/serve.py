"""``sandboxctl serve``: a whole one-host development fleet in one process, no configuration.

One process holds the host agent, its HTTP API, the mesh inventory source over that one
agent, the sandbox store, the Kubernetes-style API, the e2b API and the envd proxy (all
over the one store); every app is served by one uvicorn server (``run_servers``). See
docs/serve.md and docs/envd-proxy.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from sandboxctl.apiserver.e2b import E2bConfig, create_e2b_app, load_api_keys
from sandboxctl.apiserver.kube import create_kube_app
from sandboxctl.apiserver.kubeconfig import server_url, write_kubeconfig
from sandboxctl.cli.options import (
    PublishInterval,
    Reference,
    StaleAfter,
    freshness_rule,
    parse_pool_flag,
    read_token,
)
from sandboxctl.core.errors import ConfigurationError, SandboxctlError
from sandboxctl.core.freshness import (
    DEFAULT_PUBLISH_INTERVAL,
    DEFAULT_STALE_AFTER,
    FreshnessRule,
    ReferenceMode,
)
from sandboxctl.core.model import PoolKey
from sandboxctl.inventory.mesh import MeshInventorySource
from sandboxctl.proxy import create_proxy_app
from sandboxctl.sandboxd.agent import Agent, AgentSettings
from sandboxctl.sandboxd.api import create_app as create_agent_app
from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime
from sandboxctl.serving import bind, run_servers
from sandboxctl.store import SandboxStore
from sandboxctl.store.nodes import NodeAccess

log = logging.getLogger("sandboxctl.serve")

DEFAULT_STATE_DIR = Path(".sandboxctl")
DEFAULT_POOL = "base=2"
DEFAULT_DOMAIN = "sandboxctl.local"
NAMESPACE = "default"
MESH_POLL = timedelta(seconds=1)
READY_TIMEOUT = 120.0  # seconds for every part to answer and the warm pools to fill
CHECK_TIMEOUT = 2.0  # seconds per readiness request

KEY_FILE = "e2b-api-keys"
ENVD_SECRET_FILE = "envd-secret"
TOKEN_FILE = "sandboxd-token"
ENV_FILE = "e2b.env"
KUBECONFIG_FILE = "kubeconfig"
AGENT_DIR = "sandboxd"


def serve(
    state_dir: Annotated[
        Path,
        typer.Option(
            "--state-dir",
            help="Where the fleet keeps its keys, tokens, kubeconfig and sandboxes "
            "(created 0711 on first start).",
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
    pool: Annotated[
        list[str] | None,
        typer.Option(
            "--pool",
            metavar="TEMPLATE[/NET[/SIZE]]=N",
            help=f"Keep N warm sandboxes of this pool key (repeatable; default {DEFAULT_POOL}).",
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
    stale_after: StaleAfter = DEFAULT_STALE_AFTER,
    reference: Reference = ReferenceMode.PUBLISH,
    publish_interval: PublishInterval = DEFAULT_PUBLISH_INTERVAL,
) -> None:
    """Run a whole one-host development fleet: agent, Kubernetes-style API, e2b API and
    envd proxy."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per inventory poll
    pools = dict(parse_pool_flag(text) for text in pool or (DEFAULT_POOL,))
    rule = freshness_rule(stale_after, reference, publish_interval)
    BubblewrapRuntime.check()  # root, the host tools, user namespaces: one line, exit 2
    state_dir = state_dir.absolute()
    _check_traversable(state_dir)

    # Every port first: a taken one fails at once, before anything starts or is written.
    with contextlib.ExitStack() as bound:
        sockets = [
            bound.enter_context(bind(host, port))
            for port in (sandboxd_port, kube_port, e2b_port, proxy_port)
        ]
        _run(
            Fleet(
                state_dir=state_dir,
                host=host,
                ports=Ports(*(sock.getsockname()[1] for sock in sockets)),
                pools=pools,
                max_sandboxes=max_sandboxes,
                uid_base=uid_base,
                domain=domain,
                keep_sandboxes=keep_sandboxes,
            ),
            rule,
            sockets,
        )


@dataclass(frozen=True, slots=True)
class Ports:
    sandboxd: int
    kube: int
    e2b: int
    proxy: int


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

    def url(self, port: int) -> str:
        return server_url(self.host, port)

    @property
    def agent_addr(self) -> str:
        return self.url(self.ports.sandboxd).removeprefix("http://")


@dataclass(frozen=True, slots=True)
class Secrets:
    api_key: str
    api_keys: Mapping[str, str]
    envd_secret: bytes
    root_token: str


def _run(fleet: Fleet, rule: FreshnessRule, sockets: list[socket.socket]) -> None:
    agent_sock, kube_sock, e2b_sock, proxy_sock = sockets
    found = prepare_state_dir(fleet.state_dir)
    if fleet.host not in ("localhost", "::1") and not fleet.host.startswith("127."):
        log.warning(
            "--host %s is not loopback: the Kubernetes-style API has no authentication, so "
            "anyone who reaches port %d can create and delete sandboxes",
            fleet.host,
            fleet.ports.kube,
        )
    agent = Agent(
        AgentSettings(
            node=socket.gethostname() or "local",
            advertise_addr=fleet.agent_addr,
            state_dir=fleet.state_dir / AGENT_DIR,
            max_sandboxes=fleet.max_sandboxes,
            pools=dict(fleet.pools),
            uid_base=fleet.uid_base,
        ),
        BubblewrapRuntime(),
    )
    inventories = MeshInventorySource([fleet.agent_addr], found.root_token, MESH_POLL)
    store = SandboxStore(inventories, rule, nodes=NodeAccess(found.root_token))
    stopping = threading.Event()
    readiness: threading.Thread | None = None
    try:
        agent.start()  # adopts what a --keep-sandboxes run left, and logs it
        listeners: list[tuple[Any, socket.socket]] = [
            (create_agent_app(agent, found.root_token), agent_sock),
            # The first thing uvicorn's shutdown does is close the listening sockets:
            # open watches end then, so a stop is not held up by a long watch.
            (create_kube_app(store, stopping=lambda: kube_sock.fileno() == -1), kube_sock),
        ]
        config = E2bConfig(
            domain=fleet.domain,
            envd_secret=found.envd_secret,
            api_keys=found.api_keys,
            namespace=NAMESPACE,
        )
        listeners.append((create_e2b_app(store, config), e2b_sock))
        # The envd proxy over the same store: the SDK's envd calls (E2B_SANDBOX_URL).
        listeners.append((create_proxy_app(store, found.envd_secret, fleet.domain), proxy_sock))
        write_client_files(fleet, found)
        _say(usage(fleet))
        checks = Readiness(fleet, agent, store, inventories, found.root_token, stopping)
        readiness = threading.Thread(target=checks.run, name="sandboxctl-readiness", daemon=True)
        readiness.start()
        # A closed terminal stops the fleet like Ctrl-C (SIGHUP would end it at once and
        # leave every sandbox running); run_servers handles SIGINT and SIGTERM.
        signal.signal(signal.SIGHUP, lambda *_: signal.raise_signal(signal.SIGTERM))
        run_servers(listeners)
        log.info("stopping")
    finally:
        stopping.set()
        if readiness is not None:
            readiness.join(timeout=CHECK_TIMEOUT + 5)
        inventories.stop()
        store.close()
        destroy = not fleet.keep_sandboxes
        agent.stop(destroy=destroy)
        log.info(
            "stopped; sandboxes %s",
            "destroyed" if destroy else "left running (--keep-sandboxes)",
        )


# --- the state directory ----------------------------------------------------------------


def prepare_state_dir(state_dir: Path) -> Secrets:
    """Create the directory (0711) and its secrets on first start; reuse them later."""
    if not state_dir.exists():
        state_dir.mkdir(parents=True)
        state_dir.chmod(0o711)  # sandbox uids traverse it to DIR/sandboxd/homes
        log.info("created %s", state_dir)
    elif not state_dir.is_dir():
        raise ConfigurationError(f"--state-dir {state_dir}: not a directory")
    key_file = state_dir / KEY_FILE
    fresh_key = f"e2b_{secrets.token_hex(20)}"
    _create_secret(key_file, f"{fresh_key} {NAMESPACE}\n")
    api_keys = load_api_keys(key_file, namespace=NAMESPACE)
    envd_secret = _create_secret(state_dir / ENVD_SECRET_FILE, secrets.token_hex(32) + "\n")
    root_token = _create_secret(state_dir / TOKEN_FILE, secrets.token_urlsafe(32) + "\n")
    return Secrets(
        api_key=next(iter(api_keys)),
        api_keys=api_keys,
        envd_secret=envd_secret.encode(),
        root_token=root_token,
    )


def _create_secret(path: Path, text: str) -> str:
    """The file's trimmed text; a missing file is created first with ``text``, mode 0600."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            log.warning("%s is readable by others (mode %04o); chmod 600 it", path, mode)
    else:
        with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
            stream.write(text)
        log.info("created %s", path)
    return read_token(str(path), path)


def _check_traversable(state_dir: Path) -> None:
    """Sandbox uids reach their homes under DIR/sandboxd/homes: every existing directory
    above them must let others through (o+x), or every sandbox start fails."""
    for directory in (state_dir, *state_dir.parents):
        if not directory.exists():
            continue
        mode = stat.S_IMODE(directory.stat().st_mode)
        if not mode & stat.S_IXOTH:
            raise ConfigurationError(
                f"--state-dir {state_dir}: sandbox uids cannot traverse {directory} "
                f"(mode {mode:04o}); chmod o+x it or pick a --state-dir under a directory "
                "others may enter, e.g. /var/tmp/sandboxctl"
            )


def write_client_files(fleet: Fleet, found: Secrets) -> None:
    """DIR/e2b.env for the e2b SDK and DIR/kubeconfig for kubectl, both 0600."""
    env = (
        f"E2B_API_URL={fleet.url(fleet.ports.e2b)}\n"
        f"E2B_SANDBOX_URL={fleet.url(fleet.ports.proxy)}\n"
        f"E2B_API_KEY={found.api_key}\n"
    )
    _write_private(fleet.state_dir / ENV_FILE, env)
    write_kubeconfig(fleet.state_dir / KUBECONFIG_FILE, fleet.url(fleet.ports.kube))


def _write_private(target: Path, text: str) -> None:
    descriptor, scratch = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
            os.fchmod(stream.fileno(), 0o600)
            stream.write(text)
        os.replace(scratch, target)
    except BaseException:
        Path(scratch).unlink(missing_ok=True)
        raise


def usage(fleet: Fleet) -> str:
    directory = _shown(fleet.state_dir)
    lines = [
        "sandboxctl serve: a one-host development fleet",
        f"  e2b API         {fleet.url(fleet.ports.e2b)}",
        f"  Kubernetes API  {fleet.url(fleet.ports.kube)}",
        f"  sandboxd        {fleet.url(fleet.ports.sandboxd)}  (token in {directory}/{TOKEN_FILE})",
        f"  envd proxy      {fleet.url(fleet.ports.proxy)}  (sandbox commands and files)",
        "",
        "Use it with the e2b SDK (pip install e2b):",
        f"  set -a; . {directory}/{ENV_FILE}; set +a",
        "  python -c 'from e2b import Sandbox; s = Sandbox.create(); "
        "print(s.sandbox_id); s.kill()'",
        "  python -c 'from e2b import Sandbox; s = Sandbox.create(); "
        'print(s.commands.run("echo hi").stdout, end=""); s.kill()\'',
        "and with kubectl:",
        f"  kubectl --kubeconfig {directory}/{KUBECONFIG_FILE} get sandboxes",
        "Stop with Ctrl-C (sandboxes are "
        + ("left running)" if fleet.keep_sandboxes else "destroyed; --keep-sandboxes keeps them)"),
    ]
    return "\n".join(lines)


def _shown(path: Path) -> str:
    """The state directory as the user would type it: relative when under the cwd."""
    try:
        relative = path.relative_to(Path.cwd())
    except ValueError:
        return str(path)
    return str(relative) if str(relative) != "." else "."


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


# --- readiness ------------------------------------------------------------------------


Checks = dict[str, Callable[[], str | None]]


class Readiness:
    """Waits, off the serving thread, until every part answers; then says ``ready:``."""

    def __init__(
        self,
        fleet: Fleet,
        agent: Agent,
        store: SandboxStore,
        inventories: MeshInventorySource,
        root_token: str,
        stopping: threading.Event,
        timeout: float = READY_TIMEOUT,
    ) -> None:
        self.fleet = fleet
        self.agent = agent
        self.store = store
        self.inventories = inventories
        self.root_token = root_token
        self.stopping = stopping
        self.timeout = timeout

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout
        try:
            with httpx.Client(timeout=CHECK_TIMEOUT) as http:
                # The agent first: the inventory starts as soon as it answers, so the
                # APIs see the node even if another part never answers.
                agent, apis = self._http_checks(http)
                if not self._wait_http(agent, deadline) or not self._start_inventory():
                    return
                if not self._wait_http(apis, deadline):
                    return
            if not self._wait(deadline, "the mesh inventory to list the node", self._node_listed):
                return
            pools = self._wait(deadline, "", self._pools_full, report=False)
        except Exception:  # never let a readiness bug take anything down
            log.exception("readiness check failed")
            return
        if self.stopping.is_set():
            return
        summary = self._pool_summary()
        if not pools:
            log.warning(
                "warm pools did not reach their target within %.0fs (%s); claims start "
                "sandboxes cold meanwhile",
                self.timeout,
                summary,
            )
        ports = self.fleet.ports
        parts = [
            f"e2b API {self.fleet.url(ports.e2b)}",
            f"envd proxy {self.fleet.url(ports.proxy)}",
            f"Kubernetes API {self.fleet.url(ports.kube)}",
            f"sandboxd {self.fleet.url(ports.sandboxd)} (node {self.agent.settings.node})",
            f"warm pools {summary}" if summary else "no warm pools",
        ]
        _say("ready: " + ", ".join(part for part in parts if part))

    def _http_checks(self, http: httpx.Client) -> tuple[Checks, Checks]:
        """(the agent's check, the APIs' checks): each None when it answers, else why not."""
        ports = self.fleet.ports
        auth = {"Authorization": f"Bearer {self.root_token}"}
        agent: Checks = {
            "sandboxd (GET /v1/info)": lambda: _answers(
                http, f"{self.fleet.url(ports.sandboxd)}/v1/info", auth
            ),
        }
        apis: Checks = {
            "the Kubernetes API (GET /version)": lambda: _answers(
                http, f"{self.fleet.url(ports.kube)}/version"
            ),
            "the e2b API (GET /health)": lambda: _answers(
                http, f"{self.fleet.url(ports.e2b)}/health"
            ),
            "the envd proxy (GET /healthz)": lambda: _answers(
                http, f"{self.fleet.url(ports.proxy)}/healthz"
            ),
        }
        return agent, apis

    def _wait_http(self, checks: Checks, deadline: float) -> bool:
        pending = dict(checks)
        reasons: dict[str, str] = {}
        while pending:
            for name, check in list(pending.items()):
                reason = check()
                if reason is None:
                    del pending[name]
                else:
                    reasons[name] = reason
            if not pending:
                return True
            if self.stopping.is_set():
                return False
            if time.monotonic() > deadline:
                for name in pending:
                    log.error(
                        "not ready: %s did not answer within %.0fs: %s",
                        name,
                        self.timeout,
                        reasons[name],
                    )
                return False
            self.stopping.wait(0.05)
        return True

    def _start_inventory(self) -> bool:
        if self.stopping.is_set():
            return False
        try:
            self.inventories.start()  # polls the agent once, then every second
        except (SandboxctlError, RuntimeError) as error:
            if not self.stopping.is_set():
                log.error("not ready: the mesh inventory cannot read the agent: %s", error)
            return False
        return True

    def _wait(
        self, deadline: float, what: str, check: Callable[[], bool], report: bool = True
    ) -> bool:
        while not check():
            if self.stopping.is_set():
                return False
            if time.monotonic() > deadline:
                if report:
                    log.error("not ready: timed out after %.0fs waiting for %s", self.timeout, what)
                return False
            self.stopping.wait(0.05)
        return True

    def _node_listed(self) -> bool:
        return self.agent.settings.node in self.store.view().fresh_nodes()

    def _pools_full(self) -> bool:
        return all(p["warm"] >= p["target"] for p in self.agent.info()["pools"])

    def _pool_summary(self) -> str:
        rows = []
        for row in self.agent.info()["pools"]:
            key = row["key"]
            name = "/".join(str(key[part]) for part in ("template", "net", "size") if part in key)
            rows.append(f"{name} {row['warm']}/{row['target']}")
        return ", ".join(rows)


def _answers(http: httpx.Client, url: str, headers: Mapping[str, str] | None = None) -> str | None:
    """None when ``url`` answers below 400, else why not (one line)."""
    try:
        response = http.get(url, headers=headers)
    except httpx.HTTPError as error:
        return str(error) or type(error).__name__
    if response.status_code >= 400:
        return f"{response.status_code} {response.text.strip()[:200]}"
    return None

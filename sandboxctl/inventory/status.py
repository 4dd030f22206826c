"""What ``sandboxctl status`` reads: one view of a fleet, from serve's state dir, from the
agents themselves (mesh), or from the NodeInventory objects of a Kubernetes API (kube).

Serve's state dir names the fleet's endpoints in the files it writes on every start
(``e2b.env``: the e2b API and the envd proxy; ``kubeconfig``: the Sandbox API and its
certificate; ``endpoints.json``: the agent and the metrics listener) and holds the agents'
root token (``sandboxd-token``). Every endpoint is asked at once, each within one timeout,
so a read costs about one round trip to the slowest.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx  # loaded by the agent API's client in any case

from sandboxctl.clock import Clock, SystemClock
from sandboxctl.core.errors import ConfigurationError
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.statedir import (
    ENDPOINTS_FILE,
    ENV_FILE,
    KUBECONFIG_FILE,
    TOKEN_FILE,
    parse_endpoints,
)
from sandboxctl.core.status import Endpoint, FleetStatus, Unreached, fleet_status
from sandboxctl.inventory.live import (
    READ_TIMEOUT,
    AgentsRead,
    MeshStartError,
    check_answers,
    list_node_inventories,
    read_agents,
    transport,
)
from sandboxctl.secretfiles import read_secret

PROBE_TIMEOUT = 2.0  # seconds for an endpoint's health answer


@dataclass(frozen=True, slots=True)
class FromStateDir:
    """The fleet ``serve`` runs over ``state_dir``; ``seeds``, when named, are asked
    instead of the agent its state dir names."""

    state_dir: Path
    seeds: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class FromAgents:
    """The agents themselves, with the fleet's root token (None: development agents)."""

    seeds: tuple[str, ...]
    token: str | None


@dataclass(frozen=True, slots=True)
class FromKube:
    """The NodeInventory objects of the Kubernetes API a kubeconfig names."""

    kubeconfig: Path | None


StatusSource = FromStateDir | FromAgents | FromKube


def collect_status(
    source: StatusSource,
    rule: FreshnessRule,
    clock: Clock | None = None,
    need_a_node: bool = True,
) -> FleetStatus:
    """One read of the fleet, judged now. ``need_a_node``: fail (one line) when no agent
    answers, as a one-shot read must; a watch draws the failure instead."""
    clock = clock or SystemClock()
    if isinstance(source, FromKube):
        inventories, server = list_node_inventories(source.kubeconfig)
        where = f"the NodeInventory objects at {server}"
        return fleet_status(
            inventories, rule, clock.now(), where, [Endpoint("Kubernetes API", server)]
        )
    if isinstance(source, FromAgents):
        read = read_agents(source.seeds, source.token, READ_TIMEOUT, clock)
        check_answers(read.results, need_a_node, one_shot=True)
        where = f"{len(source.seeds)} sandboxd agent{'s' if len(source.seeds) != 1 else ''} (mesh)"
        return _agents_status(read, rule, clock, where, [])
    return _state_dir_status(source, rule, clock, need_a_node)


def _agents_status(
    read: AgentsRead, rule: FreshnessRule, clock: Clock, where: str, endpoints: list[Endpoint]
) -> FleetStatus:
    agents = [
        Endpoint("sandboxd", _origin(r.address), "" if r.ok else r.reason) for r in read.results
    ]
    unreached = [Unreached(r.address, r.reason) for r in read.failed]
    return fleet_status(
        read.inventories, rule, clock.now(), where, [*endpoints, *agents], unreached
    )


# --- serve's state dir -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServeState:
    """What serve's state dir says about its fleet."""

    e2b_url: str
    proxy_url: str
    kube_url: str
    kube_ca: bytes | None  # the Sandbox API's certificate (PEM), to trust for its probe
    token: str
    agent_address: str  # HOST:PORT
    metrics_url: str  # "" when serve serves no metrics listener


def read_state_dir(state_dir: Path) -> ServeState:
    """The endpoints and the token serve wrote in ``state_dir`` (one line naming the
    file when one cannot be read)."""
    if not state_dir.is_dir():
        raise ConfigurationError(
            f"--state-dir {state_dir}: no such directory: serve writes it on its first start "
            "(make serve, or sandboxctl serve --state-dir DIR)"
        )
    env = _env_file(state_dir / ENV_FILE)
    cluster = _kube_cluster(state_dir / KUBECONFIG_FILE)
    token = read_secret("--state-dir", state_dir / TOKEN_FILE)
    endpoints_file = state_dir / ENDPOINTS_FILE
    endpoints = parse_endpoints(_read(endpoints_file), f"--state-dir: {endpoints_file}")
    ca = cluster.get("certificate-authority-data")
    return ServeState(
        e2b_url=env.get("E2B_API_URL", ""),
        proxy_url=env.get("E2B_SANDBOX_URL", ""),
        kube_url=str(cluster.get("server") or ""),
        kube_ca=base64.b64decode(ca) if isinstance(ca, str) else None,
        token=token,
        agent_address=endpoints.sandboxd,
        metrics_url=endpoints.metrics,
    )


def _env_file(path: Path) -> dict[str, str]:
    text = _read(path)
    pairs = (line.partition("=") for line in text.splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, _, value in pairs}


def _kube_cluster(path: Path) -> dict[str, Any]:
    import yaml

    try:
        config = yaml.safe_load(_read(path))
        cluster = config["clusters"][0]["cluster"]
    except (yaml.YAMLError, KeyError, IndexError, TypeError) as error:
        raise ConfigurationError(f"--state-dir: {path}: not a kubeconfig serve wrote") from error
    return cluster if isinstance(cluster, dict) else {}


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigurationError(
            f"--state-dir: {path} does not exist: serve writes it once it has started"
        ) from None
    except OSError as error:
        raise ConfigurationError(
            f"--state-dir: {path}: {error.strerror} (serve's state dir is its owner's only: "
            "run as that user, root for make serve)"
        ) from None


def _state_dir_status(
    source: FromStateDir, rule: FreshnessRule, clock: Clock, need_a_node: bool
) -> FleetStatus:
    state = read_state_dir(source.state_dir)
    seeds = source.seeds or (state.agent_address,)
    probes: dict[str, tuple[str, Callable[[], str]]] = {
        "e2b API": (state.e2b_url, lambda: _probe(f"{state.e2b_url}/health")),
        "envd proxy": (state.proxy_url, lambda: _probe(f"{state.proxy_url}/healthz")),
        "Kubernetes API": (
            state.kube_url,
            lambda: _probe(f"{state.kube_url}/readyz", _trusting(state.kube_ca)),
        ),
        "metrics": (state.metrics_url, lambda: _probe(f"{state.metrics_url}/healthz")),
    }
    with ThreadPoolExecutor(len(probes), thread_name_prefix="sandboxctl-probe") as pool:
        asked: dict[str, Future[str]] = {
            name: pool.submit(check) for name, (_, check) in probes.items()
        }
        read = read_agents(seeds, state.token, READ_TIMEOUT, clock)
        endpoints = [
            Endpoint(name, probes[name][0], future.result()) for name, future in asked.items()
        ]
    for result in read.results:
        if result.status == 401:
            raise MeshStartError(
                f"sandboxd {result.address} refused the token in {source.state_dir / TOKEN_FILE}: "
                "it is not this fleet's agent"
            )
    check_answers(read.results, need_an_answer=False, one_shot=True)
    if need_a_node and not read.inventories:
        failed = ", ".join(f"{r.address} ({r.reason})" for r in read.results)
        raise MeshStartError(
            f"no sandboxd of the fleet in {source.state_dir} answered: {failed}: is serve running?"
        )
    return _agents_status(read, rule, clock, f"serve's state dir {source.state_dir}", endpoints)


def _trusting(ca_pem: bytes | None) -> ssl.SSLContext | None:
    return ssl.create_default_context(cadata=ca_pem.decode("ascii")) if ca_pem else None


def _probe(url: str, trust: ssl.SSLContext | None = None) -> str:
    """ "" when ``url`` answers below 400, else why not (one line). ``trust``: what to
    trust over HTTPS (the system's certificates by default)."""
    if not urlsplit(url).netloc:
        return "not in the state dir"
    try:
        with (
            httpx.Client(transport=transport(url, trust), timeout=PROBE_TIMEOUT) as http,
            http.stream("GET", url) as response,  # the status is the answer: no body read
        ):
            pass
    except httpx.HTTPError as error:
        return " ".join((str(error) or type(error).__name__).split())
    if response.status_code >= 400:
        return f"answered {response.status_code}"
    return ""


def _origin(address: str) -> str:
    return address if "://" in address else f"http://{address}"

"""What the sandbox lanes read of a kit: lists through both APIs, a watch that tells its
opening burst from what follows, an agent's request counts, a host's inventory, fresh
claims on a chosen host. Reads only; every judgment is the scenario's."""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from sandboxctl.agentapi import (
    AgentApiError,
    AgentClient,
    AgentError,
    ClaimGrant,
    ClaimRequest,
)
from sandboxctl.core import names
from sandboxctl.kube import NODE_INVENTORIES, CustomObjects, KubeError, KubeNotFound, api_client
from sandboxctl.lanes.kit import Host, Kit, Replica
from sandboxctl.lanes.model import Lane, LaneError, Progress, Verdict, Windows

SANDBOXES = f"/apis/{names.SANDBOXES.api_version}/{names.SANDBOXES.plural}"
NAMESPACE = "default"
PHASE_LABEL = "sandbox.cocoonstack.io/phase"
STAMP = "publishedAt"  # a NodeInventory's publish time; an old publisher writes none
WATCH_TICK = 1.0  # a watch wakes every second for inventory changes (docs/api.md#watches)
BOOKMARK_END = "k8s.io/initial-events-end"
# The agent's routes that address one sandbox: only reads and verbs of that sandbox use
# them (the publisher reads /v1/info and /v1/sandboxes, the warm-pool driver /v1/pools).
PER_SANDBOX_ROUTE = "/v1/sandboxes/{sandbox_id}"
SAMPLE_SLACK = 15.0  # seconds past a span's end before its polls count as stuck
CLAIM_TTL = 600  # seconds: outlives any lane, so a lane never runs on expired claims


Observed = TypeVar("Observed")


class MeasuredLane(Generic[Observed]):
    """A scenario of one lane: measure through the kit's clients, then judge what was
    observed (a pure function of it and the kit's windows, so a fake kit can test it)."""

    lanes: tuple[Lane, ...]

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock

    def run(self, kit: Kit, selected: frozenset[str], progress: Progress) -> Iterable[Verdict]:
        if self.lanes[0].id in selected:
            with Clients(kit) as clients:
                observed = self.measure(clients, progress)
            yield self.judged(observed, kit, progress)

    def measure(self, clients: Clients, progress: Progress) -> Observed:
        raise NotImplementedError

    def judged(self, observed: Observed, kit: Kit, progress: Progress) -> Verdict:
        raise NotImplementedError


def namespaced(namespace: str = NAMESPACE) -> str:
    return f"/apis/{names.SANDBOXES.api_version}/namespaces/{namespace}/{names.SANDBOXES.plural}"


class Clients:
    """The kit's API clients, each made once and kept for a scenario's polls (making a
    client costs more than a request); closed on exit: ``with Clients(kit) as clients``."""

    def __init__(self, kit: Kit) -> None:
        self.kit = kit
        self._made: dict[str, httpx.Client] = {}

    def kube(self, replica: Replica) -> httpx.Client:
        return self._keep(f"kube {replica.name}", lambda: self.kit.kube(replica))

    def e2b(self, replica: Replica) -> httpx.Client:
        return self._keep(f"e2b {replica.name}", lambda: self.kit.e2b(replica))

    def proxy(self) -> httpx.Client:
        return self._keep("proxy", self.kit.proxy)

    def _keep(self, key: str, make: Callable[[], httpx.Client]) -> httpx.Client:
        client = self._made.get(key)
        if client is None:
            client = self._made[key] = make()
        return client

    def __enter__(self) -> Clients:
        return self

    def __exit__(self, *exc: object) -> None:
        for client in self._made.values():
            client.close()
        self._made.clear()


Reader = Kit | Clients  # a kit: a client made for the one read and closed


@contextmanager
def _clients(reader: Reader) -> Iterator[Clients]:
    if isinstance(reader, Clients):
        yield reader
    else:
        with Clients(reader) as made:
            yield made


def listed(reader: Reader, replica: Replica) -> dict[str, str]:
    """Every sandbox the replica's Sandbox API lists: ``namespace/name`` -> node."""
    with _clients(reader) as clients:
        answer = clients.kube(replica).get(SANDBOXES, timeout=5)
    answer.raise_for_status()
    return {
        f"{item['metadata']['namespace']}/{item['metadata']['name']}": item["status"]["nodeName"]
        for item in answer.json()["items"]
    }


def try_listed(reader: Reader, replica: Replica) -> dict[str, str] | None:
    """``listed``, or None when the replica does not answer (down, or an error)."""
    try:
        return listed(reader, replica)
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def wait_listed(clients: Clients, progress: Progress, what: str, names: frozenset[str]) -> None:
    """Until every replica lists ``names`` (what a lane claimed: its next publish)."""
    kit = clients.kit
    progress.wait_for(
        f"both replicas to list {what}",
        lambda: all(names <= set(try_listed(clients, r) or {}) for r in kit.replicas),
        2 * kit.windows.publish + 5,
    )


def e2b_listed(reader: Reader, replica: Replica) -> dict[str, str]:
    """Every sandbox the replica's e2b API lists: sandboxID -> clientID (its node)."""
    with _clients(reader) as clients:
        answer = clients.e2b(replica).get("/sandboxes", timeout=5)
    answer.raise_for_status()
    return {item["sandboxID"]: item["clientID"] for item in answer.json()}


def healthy(reader: Reader, replica: Replica) -> bool:
    """Whether both of the replica's APIs answer their health checks."""
    try:
        with _clients(reader) as clients:
            kube = clients.kube(replica).get("/healthz", timeout=2)
            e2b = clients.e2b(replica).get("/health", timeout=2)
    except httpx.HTTPError:
        return False
    return kube.is_success and e2b.is_success  # 200 and 204


def proxy_up(reader: Reader) -> bool:
    try:
        with _clients(reader) as clients:
            return clients.proxy().get("/healthz", timeout=2).is_success  # 204
    except httpx.HTTPError:
        return False


def on_node(names: dict[str, str], node: str) -> set[str]:
    return {name for name, where in names.items() if where == node}


def inventory(kit: Kit, host: Host) -> dict[str, Any] | None:
    """The host's NodeInventory as the control plane holds it; None when absent."""
    kubeconfig = kit.kubeconfig
    try:
        return _inventories(kubeconfig, kubeconfig.stat().st_mtime_ns).get(host.node)
    except KubeNotFound:
        return None


@functools.lru_cache(maxsize=4)
def _inventories(kubeconfig: Path, version: int) -> CustomObjects:
    """One client per kubeconfig (as written: ``version``), kept across polls: making one
    costs more than the read."""
    return CustomObjects(api_client(kubeconfig), NODE_INVENTORIES)


def stamp_of(inventory: dict[str, Any] | None) -> str:
    """An inventory's ``publishedAt`` as written; "" when it has none (or is absent)."""
    return str((inventory or {}).get(STAMP) or "")


def try_inventory(kit: Kit, host: Host) -> dict[str, Any] | None:
    """``inventory``, also None when the control plane did not answer."""
    try:
        return inventory(kit, host)
    except KubeError:
        return None


def heal_bound(windows: Windows) -> float:
    """How long a healing kit may take to list both hosts again: a stale node's window,
    a few publishes, and the parts' start-up."""
    return windows.stale_after + 3 * windows.publish + 10.0


POOL_FILL_SECONDS = 90.0  # for a healed kit's warm pool to refill


def pool_full(kit: Kit, size: int) -> bool:
    """Whether hosts A and B together hold ``size`` warm sandboxes (False when either
    agent does not answer)."""
    warm = 0
    for host in (kit.a, kit.b):
        try:
            with kit.agent(host) as agent:
                warm += sum(pool.warm for pool in agent.info().pools)
        except Exception:
            return False
    return warm >= size


def observe(
    progress: Progress,
    what: str,
    clock: Callable[[], float],
    until: float,
    sample: Callable[[], object],
) -> None:
    """Call ``sample`` at every poll until ``clock()`` reaches ``until``: a lane's
    "throughout" is every poll of such a span."""

    def check() -> bool:
        sample()
        return clock() >= until

    progress.wait_for(what, check, max(0.0, until - clock()) + SAMPLE_SLACK)


# --- claims --------------------------------------------------------------------------


def claim_fresh(kit: Kit, host: Host, prefix: str, count: int) -> dict[str, ClaimGrant]:
    """``count`` new sandboxes claimed on the host's agent directly (placement through an
    API server is random), named ``default/<prefix>-<i>``: ``namespace/name`` -> grant."""
    grants: dict[str, ClaimGrant] = {}
    with kit.agent(host) as agent:
        for i in range(count):
            ref = f"{NAMESPACE}/{prefix}-{i}"
            try:
                grants[ref] = claim(kit, agent, host, ref)
            except LaneError:
                release(kit, host, grants)
                raise
    return grants


def claim(kit: Kit, agent: AgentClient, host: Host, ref: str) -> ClaimGrant:
    """One sandbox of the kit's template claimed as ``ref`` through ``host``'s agent."""
    request = ClaimRequest(template=kit.template, claim_ref=ref, ttl_seconds=CLAIM_TTL)
    try:
        return agent.claim(request)
    except AgentApiError as error:
        raise LaneError(f"claiming {ref} on {host.label} ({host.node}): {error}") from error


def release(kit: Kit, host: Host, grants: dict[str, ClaimGrant]) -> None:
    """Release what a lane claimed; one already gone (or an agent down) is left."""
    with kit.agent(host) as agent:
        for grant in grants.values():
            try:
                agent.release(grant.id)
            except AgentError as error:
                if error.status != 404:
                    raise
            except AgentApiError:
                continue


# --- an agent's request counts -------------------------------------------------------


def samples(metrics_text: str, name: str) -> Iterator[Sample]:
    """The samples named ``name`` in a /metrics text."""
    for family in text_string_to_metric_families(metrics_text):
        yield from (sample for sample in family.samples if sample.name == name)


def per_sandbox_requests(metrics_text: str) -> int:
    """Requests an agent answered on its per-sandbox routes, from its /metrics text."""
    return int(
        sum(
            sample.value
            for sample in samples(metrics_text, "sandboxd_requests_total")
            if sample.labels.get("route", "").startswith(PER_SANDBOX_ROUTE)
        )
    )


# --- a watch -------------------------------------------------------------------------


@dataclass
class Event:
    at: float  # the caller's clock
    type: str
    name: str  # namespace/name
    node: str


@dataclass
class Watch:
    """A Sandbox API watch opened with its initial events: what came before the
    initial-events-end BOOKMARK is the opening burst; ``after`` is everything since."""

    opening: list[Event] = field(default_factory=list)
    after: list[Event] = field(default_factory=list)
    opened: threading.Event = field(default_factory=threading.Event)
    failed: str = ""
    ended: bool = False  # the stream ended (the server's timeout or close, or ours)

    def deleted(self) -> set[str]:
        """The names DELETED since the opening burst."""
        return {e.name for e in self.after if e.type == "DELETED"}

    def read(self, lines: Iterator[str], clock: Callable[[], float]) -> None:
        for line in lines:
            if not line.strip():
                continue
            event = json.loads(line)
            obj = event.get("object") or {}
            meta = obj.get("metadata") or {}
            if event.get("type") == "BOOKMARK":
                if (meta.get("annotations") or {}).get(BOOKMARK_END) == "true":
                    self.opened.set()
                continue
            if event.get("type") == "ERROR":
                self.failed = str(obj.get("message") or obj)
                return
            name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
            node = (obj.get("status") or {}).get("nodeName", "")
            found = Event(clock(), str(event.get("type")), name, node)
            (self.after if self.opened.is_set() else self.opening).append(found)


@contextmanager
def watching(
    kit: Kit, replica: Replica, clock: Callable[[], float], seconds: float
) -> Iterator[Watch]:
    """A watch on every sandbox of the replica, read on a thread for at most
    ``seconds``; closed on exit."""
    watch = Watch()
    params = {
        "watch": "true",
        "sendInitialEvents": "true",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": str(max(1, int(seconds))),
    }
    client = kit.kube(replica)
    stream = client.stream("GET", SANDBOXES, params=params, timeout=seconds + 10)
    try:
        response = stream.__enter__()
    except BaseException:
        client.close()
        raise
    if response.status_code != 200:
        stream.__exit__(None, None, None)
        client.close()
        raise LaneError(f"watch on {replica.name}: HTTP {response.status_code}")

    def read() -> None:
        try:
            watch.read(response.iter_lines(), clock)
        except Exception as error:  # a stream closed under it ends the reader any way
            watch.failed = watch.failed or str(error) or type(error).__name__
        finally:
            watch.ended = True
            watch.opened.set()

    thread = threading.Thread(target=read, name=f"lanes-watch-{replica.name}", daemon=True)
    thread.start()
    try:
        yield watch
    finally:
        stream.__exit__(None, None, None)
        client.close()
        thread.join(timeout=5)


@contextmanager
def watching_all(
    kit: Kit, progress: Progress, clock: Callable[[], float], seconds: float
) -> Iterator[dict[str, Watch]]:
    """A :func:`watching` on every replica, by replica name, past their opening bursts."""
    with ExitStack() as stack:
        watches = {
            r.name: stack.enter_context(watching(kit, r, clock, seconds)) for r in kit.replicas
        }
        progress.wait_for(
            "the watches' opening bursts",
            lambda: all(w.opened.is_set() for w in watches.values()),
            10,
        )
        yield watches

"""The warm-pool driver: SandboxWarmPool objects made into per-node warm pools, only
while this replica holds the Lease.

Every ``interval`` (5 s) and on every pool or template event, one tick:

1. the pools and their SandboxTemplates, from informer caches (no API call);
2. the fresh nodes with an address, from the store (stale ones are excluded there);
3. each pool's key from its template (the first container's image, the
   ``sandbox.cocoonstack.io/net`` annotation, the size from its requests) and its
   ``replicas`` (default 1), spread evenly by node name (``core.warmpools``);
4. each node's **full** set in one ``PUT /v1/pools`` (a pool left out drains), at most 16
   at once, 10 s each; a node's failure is logged and the others go on;
5. each pool's status: ``replicas`` = ``readyReplicas`` = its key's warm sandboxes over
   the nodes (from the PUT answers; the inventory's count where a PUT failed), written
   only when it changed; a conflict waits for the next tick.

The driver is a leader-elected part of serve-apiserver's process manager
(``lifecycle``), and :class:`DriverLease` its election: it runs only while this replica
leads; losing the lease (a control-plane outage, a partition) stops the driver and
nothing else, and the replica campaigns again after 5 s. Without a fleet token the
driver fails closed: it logs why and sets no pools.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from kubernetes import client

from sandboxctl.agentapi import AgentApiError, AgentClient, AgentInfo, PoolTarget
from sandboxctl.apiserver.creation import ANNOTATION_NET, PodTemplate, pool_size
from sandboxctl.apiserver.status import ApiError
from sandboxctl.core import wire
from sandboxctl.core.leases import (
    LEASE_DURATION,
    REJOIN_AFTER,
    RENEW_DEADLINE,
    RETRY_PERIOD,
    WARM_POOL_SYNC_INTERVAL,
)
from sandboxctl.core.model import PoolKey
from sandboxctl.core.warmpools import WarmPoolSpec, pool_status, spread
from sandboxctl.core.wire import Model
from sandboxctl.kube import (
    SANDBOX_TEMPLATES,
    SANDBOX_WARM_POOLS,
    CustomObjects,
    Informer,
    KubeError,
    LeaderElector,
)
from sandboxctl.lifecycle import Loop, Stop
from sandboxctl.store import SandboxStore

log = logging.getLogger(__name__)

LEASE_NAME = "sandboxctl-warm-pool-driver"
DEFAULT_NAMESPACE = "sandbox-system"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
PUT_TIMEOUT = 10.0
FAN_OUT = 16


def lease_namespace() -> str:
    """The pod's namespace (its service account's), else ``sandbox-system``."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip() or DEFAULT_NAMESPACE
    except OSError:
        return DEFAULT_NAMESPACE


@dataclass(frozen=True, slots=True)
class DriverSettings:
    """How the driver syncs and campaigns (serve-apiserver's ``--warm-pool-*`` and
    ``--leader-election-*`` flags)."""

    interval: timedelta = WARM_POOL_SYNC_INTERVAL
    lease_namespace: str = ""  # empty: the pod's, else sandbox-system
    identity: str = ""  # empty: host, pid and a random suffix
    lease_duration: timedelta = LEASE_DURATION
    renew_deadline: timedelta = RENEW_DEADLINE
    retry_period: timedelta = RETRY_PERIOD
    rejoin_after: timedelta = REJOIN_AFTER


@dataclass
class TickResult:
    nodes: int = 0
    pools: int = 0
    put_failures: int = 0
    status_writes: int = 0


class WarmPoolDriver:
    """A runnable (``lifecycle``): from its start to its stop it keeps two informers and
    ticks every interval and on their events."""

    name = "warm-pool-driver"

    def __init__(
        self,
        api: client.ApiClient,
        store: SandboxStore,
        token: str | None,
        settings: DriverSettings = DriverSettings(),
        *,
        agent_factory: Callable[[str], AgentClient] | None = None,
    ) -> None:
        self._api = api
        self._store = store
        self._token = token
        self.settings = settings
        self._agent_factory = agent_factory or (
            lambda address: AgentClient(address, token, timeout=PUT_TIMEOUT)
        )
        self._pools_api = CustomObjects(api, SANDBOX_WARM_POOLS)
        self._loop = Loop(
            "warm-pool driver tick", self._tick_when_synced, settings.interval, logger=log
        )
        self._running = threading.Event()
        self._pools: Informer | None = None
        self._templates: Informer | None = None
        self.ticks = 0
        self.last: TickResult | None = None

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True from the start of a run to its end."""
        return self._running.is_set()

    def run(self, stop: Stop) -> None:
        self._pools = Informer(self._pools_api, self._on_event, name="sandboxwarmpools")
        self._templates = Informer(
            CustomObjects(self._api, SANDBOX_TEMPLATES), self._on_event, name="sandboxtemplates"
        )
        self._pools.start()
        self._templates.start()
        self._running.set()
        log.info("warm-pool driver started (every %ss)", self.settings.interval.total_seconds())
        try:
            self._loop.run(stop)
        finally:
            self._running.clear()
            self._pools.stop()
            self._templates.stop()
            log.info("warm-pool driver stopped")

    def _on_event(self, kind: str, obj: dict[str, Any]) -> None:
        self._loop.wake()

    def _tick_when_synced(self) -> None:
        assert self._pools is not None
        assert self._templates is not None
        if self._pools.synced and self._templates.synced:
            self.last = self.tick()
            self.ticks += 1

    # --- one tick ------------------------------------------------------------------------

    def tick(self) -> TickResult:
        assert self._pools is not None
        assert self._templates is not None
        pools = sorted(self._pools.items(), key=_key_of)
        specs = [self._spec(pool) for pool in pools]
        result = TickResult(pools=len(specs))
        if not self._token:
            log.warning("warm-pool driver: no --sandboxd-token-file, so no pools are set")
            return result
        addresses = {n: a for n in self._store.fresh_nodes() if (a := self._store.address(n))}
        plan = spread(specs, list(addresses))
        result.nodes = len(plan)
        warm: dict[str, dict[PoolKey, int]] = {}
        with ThreadPoolExecutor(max_workers=min(FAN_OUT, max(1, len(plan)))) as pool:
            answers = dict(
                zip(
                    plan, pool.map(lambda n: self._put(n, addresses[n], plan[n]), plan), strict=True
                )
            )
        for node, info in answers.items():
            if info is None:
                result.put_failures += 1
                warm[node] = self._listed_warm(node, specs)
            else:
                warm[node] = {p.key: p.warm for p in info.pools}
        for obj, spec in zip(pools, specs, strict=True):
            if self._write_status(obj, pool_status(spec, warm)):
                result.status_writes += 1
        return result

    def _spec(self, pool: dict[str, Any]) -> WarmPoolSpec:
        assert self._templates is not None
        meta = pool.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        spec = pool.get("spec") or {}
        replicas = spec.get("replicas", 1)
        ref = str((spec.get("sandboxTemplateRef") or {}).get("name") or "")
        template = self._templates.get(ref, namespace) if ref else None
        key = _template_key(template) if template is not None else None
        if key is None:
            log.debug("warm pool %s/%s: template %r cannot be resolved", namespace, name, ref)
        return WarmPoolSpec(namespace, name, key, int(replicas) if replicas is not None else 1)

    def _put(
        self, node: str, address: str, wanted: tuple[tuple[PoolKey, int], ...]
    ) -> AgentInfo | None:
        try:
            with self._agent_factory(address) as agent:
                return agent.set_pools([PoolTarget.of(key, count) for key, count in wanted])
        except AgentApiError as error:
            log.warning("warm-pool driver: PUT /v1/pools to node %s failed: %s", node, error)
            return None

    def _listed_warm(self, node: str, specs: list[WarmPoolSpec]) -> dict[PoolKey, int]:
        out: dict[PoolKey, int] = {}
        for key in {s.key for s in specs if s.key is not None}:
            for candidate in self._store.warm_candidates(key):
                if candidate.node == node:
                    out[key] = candidate.warm
        return out

    def _write_status(self, pool: dict[str, Any], status: dict[str, object]) -> bool:
        current = pool.get("status") or {}
        if all(current.get(k) == v for k, v in status.items()):
            return False
        meta = pool.get("metadata") or {}
        try:
            self._pools_api.patch_status(
                str(meta.get("name")),
                dict(status),
                str(meta.get("namespace")),
                str(meta.get("resourceVersion") or ""),
            )
        except KubeError as error:  # a conflict or an outage: the next tick tries again
            log.debug("warm-pool driver: status of %s: %s", meta.get("name"), error)
            return False
        return True


class DriverLease:
    """The driver's Lease, as an election for a process manager (``lifecycle.Election``):
    where it is, who campaigns, and the elector that calls back on winning and losing."""

    def __init__(self, api: client.ApiClient, settings: DriverSettings = DriverSettings()) -> None:
        self._api = api
        self.settings = settings
        self.namespace = settings.lease_namespace or lease_namespace()
        self.name = LEASE_NAME
        self.identity = (
            settings.identity or f"{socket.gethostname()}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        )

    def __call__(
        self, on_started: Callable[[], None], on_stopped: Callable[[], None]
    ) -> LeaderElector:
        return LeaderElector(
            self._api,
            self.namespace,
            self.name,
            self.identity,
            on_started,
            on_stopped,
            lease_duration=self.settings.lease_duration,
            renew_deadline=self.settings.renew_deadline,
            retry_period=self.settings.retry_period,
            rejoin_after=self.settings.rejoin_after,
        )


class _TemplateSpec(Model, frozen=True):
    podTemplate: PodTemplate = PodTemplate()


class _Template(Model, frozen=True):
    """What the driver reads of a SandboxTemplate: its pod template, as a create's."""

    spec: _TemplateSpec = _TemplateSpec()


def _template_key(template: dict[str, Any]) -> PoolKey | None:
    """The pool a template's pods claim from, by the rule a create follows; None when
    it names no image or cannot be read."""
    try:
        pod = wire.decode(_Template, template).spec.podTemplate
        size = pool_size(pod.spec.containers[0]) if pod.spec.containers else ""
    except (wire.WireError, ApiError):
        return None
    if not size or not pod.spec.containers[0].image:
        return None
    net = pod.metadata.annotations.get(ANNOTATION_NET)
    return PoolKey.of(pod.spec.containers[0].image, net, size)


def _key_of(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))

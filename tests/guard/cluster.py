"""A small cluster on the API double for the guard's tests: worker pods, nodes, NodePools
and NodeClaims written straight into the double's store (setup costs no request, so the
request log holds only what the code under test sent), and reconcilers on real informers.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sandboxctl.clock import Clock, ManualClock
from sandboxctl.guard.busy import MemorySource
from sandboxctl.guard.decide import Busy
from sandboxctl.guard.pods import ANNOTATION, DISRUPTED_TAINT, NODEPOOL_LABEL, PodView
from sandboxctl.guard.reconcile import Reconciler
from sandboxctl.guard.settings import GuardSettings
from sandboxctl.kube import NODES, PODS, CoreObjects, Informer, Pods
from sandboxctl.lanes.guardkit import KWOK_NODECLASS
from sandboxctl_testing.kubeapi.resources import ResourceType
from tests.sandboxd.servers import wait_until
from tests.testing.kubeapi.double import Kube

NS = "workers"
SELECTOR = "app=worker"
T0 = datetime(2026, 6, 4, 12, 0, tzinfo=UTC)
MANAGER = "test-setup"


class StaticSource(MemorySource):
    """A busy source a test sets by pod name (unnamed pods are idle)."""

    name = "static"

    def __init__(self) -> None:
        self.busy: dict[str, Busy] = {}
        self.reads = 0

    def reading(self, pod: PodView) -> Busy:
        self.reads += 1
        return self.busy.get(pod.name, Busy.IDLE)

    def detail(self, pod: PodView) -> str:
        return self.busy.get(pod.name, Busy.IDLE).value


def settings(**overrides: Any) -> GuardSettings:
    values: dict[str, Any] = {"namespace": NS, "selector": SELECTOR}
    values.update(overrides)
    return GuardSettings(**values).validate()


class Cluster:
    def __init__(self, kube: Kube, request_log: Path) -> None:
        self.kube = kube
        self.store = kube.store
        self.request_log = request_log
        self.informers: list[Informer] = []
        self.reconcilers: list[Reconciler] = []

    def _type(self, group: str, version: str, plural: str) -> ResourceType:
        found = self.store.registry.get(group, version, plural)
        assert found is not None, plural
        return found

    # --- objects --------------------------------------------------------------------------

    def pod(
        self,
        name: str,
        *,
        node: str = "node-a",
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        grace: int | None = 600,
        phase: str = "Running",
        ip: str = "127.0.0.1",
        finalizers: Sequence[str] = (),
        namespace: str = NS,
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {"nodeName": node, "containers": [{"name": "w", "image": "w"}]}
        if grace is not None:
            spec["terminationGracePeriodSeconds"] = grace
        meta: dict[str, Any] = {
            "name": name,
            "labels": {"app": "worker", **(labels or {})},
            "annotations": dict(annotations or {}),
        }
        if finalizers:
            meta["finalizers"] = list(finalizers)
        pods = self._type("", "v1", "pods")
        self.store.create(pods, namespace, {"metadata": meta, "spec": spec}, manager=MANAGER)
        body = {"status": {"phase": phase, "podIP": ip}}
        merge = "application/merge-patch+json"
        written = self.store.patch(pods, namespace, name, merge, body, manager=MANAGER, status=True)
        return written.obj

    def node(self, name: str, nodepool: str = "workers", disrupted: bool = False) -> None:
        taints = [{"key": DISRUPTED_TAINT, "effect": "NoSchedule"}] if disrupted else []
        body = {
            "metadata": {"name": name, "labels": {NODEPOOL_LABEL: nodepool} if nodepool else {}},
            "spec": {"taints": taints},
        }
        nodes = self._type("", "v1", "nodes")
        try:
            self.store.get(nodes, "", name)
        except Exception:
            self.store.create(nodes, "", body, manager=MANAGER)
        else:
            self.store.patch(nodes, "", name, "application/merge-patch+json", body, manager=MANAGER)

    def nodepool(self, name: str, **options: Any) -> None:
        body = nodepool_body(name, **options)
        self.store.create(self._type("karpenter.sh", "v1", "nodepools"), "", body, manager=MANAGER)

    def claim(
        self, name: str, nodepool: str, *, grace: str | None, node: str = "", drifted: bool = False
    ) -> None:
        claims = self._type("karpenter.sh", "v1", "nodeclaims")
        spec: dict[str, Any] = {"nodeClassRef": KWOK_NODECLASS, "requirements": []}
        if grace is not None:
            spec["terminationGracePeriod"] = grace
        meta = {"name": name, "labels": {NODEPOOL_LABEL: nodepool}}
        self.store.create(claims, "", {"metadata": meta, "spec": spec}, manager=MANAGER)
        status: dict[str, Any] = {"nodeName": node}
        if drifted:
            status["conditions"] = [
                {"type": "Drifted", "status": "True", "reason": "NodePoolDrifted",
                 "lastTransitionTime": "2026-06-04T12:00:00Z"}
            ]  # fmt: skip
        self.store.patch(claims, "", name, "application/merge-patch+json", {"status": status},
                         manager=MANAGER, status=True)  # fmt: skip

    def get_pod(self, name: str, namespace: str = NS) -> dict[str, Any]:
        return copy.deepcopy(self.store.get(self._type("", "v1", "pods"), namespace, name))

    def annotation(self, name: str) -> str | None:
        value: str | None = (self.get_pod(name)["metadata"].get("annotations") or {}).get(
            ANNOTATION
        )
        return value

    def edit(self, name: str, metadata: dict[str, Any]) -> None:
        """A human's (or another writer's) merge patch of a pod's metadata."""
        self.store.patch(self._type("", "v1", "pods"), NS, name, "application/merge-patch+json",
                         {"metadata": metadata}, manager="kubectl-edit")  # fmt: skip

    def delete_pod(self, name: str, grace: int | None = None) -> None:
        options = {} if grace is None else {"gracePeriodSeconds": grace}
        self.store.delete(self._type("", "v1", "pods"), NS, name, options)

    def remove_pod(self, name: str) -> None:
        """Delete at once, finalizers and grace aside (the pod is gone)."""
        pods = self._type("", "v1", "pods")
        self.edit(name, {"finalizers": None})
        self.store.delete(pods, NS, name, {"gracePeriodSeconds": 0})

    # --- what the code under test sent ----------------------------------------------------

    def requests(self, method: str | None = None) -> list[dict[str, Any]]:
        if not self.request_log.exists():
            return []
        rows = [json.loads(line) for line in self.request_log.read_text().splitlines()]
        return [r for r in rows if method is None or r["method"] == method]

    def patches(self) -> list[dict[str, Any]]:
        return [r for r in self.requests("PATCH") if "/pods/" in r["path"]]

    # --- reconcilers on real informers ----------------------------------------------------

    def informer(self, resource: str, selector: str = SELECTOR) -> Informer:
        if resource == "pods":
            made = Informer(CoreObjects(self.kube.api, PODS), namespace=NS, label_selector=selector,
                            watch_seconds=30, name="test-pods")  # fmt: skip
        else:
            made = Informer(CoreObjects(self.kube.api, NODES), watch_seconds=30, name="test-nodes")
        made.start()
        assert made.wait_synced(10)
        self.informers.append(made)
        return made

    def reconciler(
        self,
        source: Any = None,
        *,
        clock: Clock | None = None,
        nodes: bool = True,
        calls: Any = None,
        **overrides: Any,
    ) -> Reconciler:
        return new_reconciler(self, source, clock, nodes, calls, overrides)

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until every informer has seen every write made so far (a bookmark or an
        event carries the double's revision; the double's versions are integers)."""
        target = self.store.rv
        for made in self.informers:
            wait_until(lambda made=made: int(made.resource_version or 0) >= target,
                       timeout=timeout, what=f"informer {made.name} to reach {target}")  # fmt: skip

    def close(self) -> None:
        for made in self.reconcilers:
            made.close()
        for informer in self.informers:
            informer.stop()


def advance(clock: ManualClock, seconds: float) -> None:
    clock.advance(timedelta(seconds=seconds))


def nodepool_body(
    name: str,
    *,
    grace: str | None = "1h",
    expire: str | None = "720h",
    policy: str = "WhenEmpty",
    budgets: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A NodePool as the guard's tests make one (on the double and the real plane alike).
    Karpenter's schema requires a node class, the requirements list, and consolidateAfter
    once disruption is given (its default fills only an absent one)."""
    template: dict[str, Any] = {"nodeClassRef": KWOK_NODECLASS, "requirements": []}
    if grace is not None:
        template["terminationGracePeriod"] = grace
    if expire is not None:
        template["expireAfter"] = expire
    disruption: dict[str, Any] = {"consolidationPolicy": policy, "consolidateAfter": "0s"}
    if budgets is not None:
        disruption["budgets"] = budgets
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {"template": {"spec": template}, "disruption": disruption},
    }


def new_reconciler(
    cluster: Any, source: Any, clock: Clock | None, nodes: bool, calls: Any,
    overrides: dict[str, Any],
) -> Reconciler:  # fmt: skip
    """A reconciler on ``cluster``'s informers (the double's or the real plane's), with the
    guard's settings and ``overrides``, closed with the cluster."""
    guard = settings(**overrides)
    made = Reconciler(
        guard,
        cluster.informer("pods", guard.label_selector),
        source if source is not None else StaticSource(),
        calls if calls is not None else Pods(cluster.kube.api),
        nodes=cluster.informer("nodes") if nodes else None,
        clock=clock or ManualClock(T0),
        jitter=lambda: 0.0,
    )
    cluster.reconcilers.append(made)
    return made

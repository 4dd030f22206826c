"""The guard's small cluster on the real control plane (``real_kube``): the same helpers as
:class:`tests.guard.cluster.Cluster`, written through kube-apiserver instead of into the
double's store, so CRD validation, merge-patch semantics, watches and deletion are the
real ones. Nodes are kwok's fake nodes (kwok runs their pods) unless a test asks for a
node with no kubelet, whose pods the test itself reports Running and which never finish
a deletion: what the guard sees of a node whose kubelet is gone.

What the real plane has no way to give: the double's request log (what the code under test
sent, with nothing else in it) and its fault injection; tests that need those stay on the
double (``tests/guard/cluster.py``)."""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client

from sandboxctl.clock import Clock
from sandboxctl.guard.pods import DISRUPTED_TAINT, NODEPOOL_LABEL
from sandboxctl.guard.reconcile import Reconciler
from sandboxctl.kube import NODES, PODS, CoreObjects, Informer, KubeNotFound, Pods
from sandboxctl.kube.resources import MERGE_PATCH
from sandboxctl.lanes.guardkit import KWOK_NODECLASS, NODECLAIMS_API
from tests.guard.cluster import (
    NS,
    SELECTOR,
    new_reconciler,
    nodepool_body,
)
from tests.sandboxd.servers import wait_until
from tests.testing.realkube import RealKube

TIMEOUT = 10.0
NODEPOOLS_API = ("karpenter.sh", "v1", "nodepools")
RUNNING_TIMEOUT = 30.0


class RealCluster:
    def __init__(self, kube: RealKube) -> None:
        self.kube = kube
        self.core = client.CoreV1Api(kube.api)
        self.custom = client.CustomObjectsApi(kube.api)
        self.pods = Pods(kube.api)
        self.without_kubelet: set[str] = set()
        self.informers: list[Informer] = []
        self.reconcilers: list[Reconciler] = []
        try:
            self.core.create_namespace({"metadata": {"name": NS}})
        except client.ApiException as error:
            if error.status != 409:
                raise

    # --- objects --------------------------------------------------------------------------

    def node(
        self, name: str, nodepool: str = "workers", disrupted: bool = False, kubelet: bool = True
    ) -> None:
        """A node labelled with its NodePool; kwok's (Ready, its pods run) unless ``kubelet``
        is False."""
        labels = {NODEPOOL_LABEL: nodepool} if nodepool else {}
        if kubelet:
            self.kube.plane.add_node(name, labels)
        else:
            self.without_kubelet.add(name)
            self.core.create_node({"metadata": {"name": name, "labels": labels}})
        if disrupted:
            taint = {"key": DISRUPTED_TAINT, "effect": "NoSchedule"}
            self.core.patch_node(name, {"spec": {"taints": [taint]}})

    def _ensure_node(self, name: str) -> None:
        try:
            self.core.read_node(name)
        except client.ApiException as error:
            if error.status != 404:
                raise
            self.node(name, nodepool="")

    def pod(
        self,
        name: str,
        *,
        node: str = "node-a",
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        grace: int | None = 600,
        finalizers: tuple[str, ...] | list[str] = (),
        phase: str = "Running",
    ) -> dict[str, Any]:
        """A worker pod bound to ``node``, in ``phase`` before this returns (kwok runs it;
        on a node without a kubelet the test reports the phase, as a kubelet would)."""
        self._ensure_node(node)
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
        self.core.create_namespaced_pod(NS, {"metadata": meta, "spec": spec})
        if node in self.without_kubelet:
            status = {"status": {"phase": phase, "podIP": "127.0.0.1"}}
            self.core.patch_namespaced_pod_status(name, NS, status, _content_type=MERGE_PATCH)
        deadline = time.monotonic() + RUNNING_TIMEOUT
        while (found := self.get_pod(name)).get("status", {}).get("phase") != phase:
            if time.monotonic() > deadline:
                raise AssertionError(f"pod {name} not {phase} within {RUNNING_TIMEOUT:.0f} s")
            time.sleep(0.05)
        return found

    def nodepool(self, name: str, **options: Any) -> None:
        self.custom.create_cluster_custom_object(*NODEPOOLS_API, nodepool_body(name, **options))

    def claim(
        self, name: str, nodepool: str, *, grace: str | None, node: str = "", drifted: bool = False
    ) -> None:
        spec: dict[str, Any] = {"nodeClassRef": KWOK_NODECLASS, "requirements": []}
        if grace is not None:
            spec["terminationGracePeriod"] = grace
        body = {
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodeClaim",
            "metadata": {"name": name, "labels": {NODEPOOL_LABEL: nodepool}},
            "spec": spec,
        }
        self.custom.create_cluster_custom_object(*NODECLAIMS_API, body)
        status: dict[str, Any] = {"nodeName": node}
        if drifted:
            status["conditions"] = [
                {"type": "Drifted", "status": "True", "reason": "NodePoolDrifted",
                 "message": "", "lastTransitionTime": "2026-06-04T12:00:00Z"}
            ]  # fmt: skip
        self.custom.patch_cluster_custom_object_status(*NODECLAIMS_API, name, {"status": status})

    def get_pod(self, name: str, namespace: str = NS) -> dict[str, Any]:
        try:
            return self.pods.get(namespace, name, TIMEOUT)
        except KubeNotFound:
            raise AssertionError(f"pod {namespace}/{name} is gone") from None

    def annotation(self, name: str) -> str | None:
        value: str | None = (self.get_pod(name)["metadata"].get("annotations") or {}).get(
            "karpenter.sh/do-not-disrupt"
        )
        return value

    def edit(self, name: str, metadata: dict[str, Any]) -> None:
        """A human's (or another writer's) merge patch of a pod's metadata."""
        self.pods.patch(NS, name, {"metadata": metadata}, TIMEOUT)

    def delete_pod(self, name: str, grace: int | None = None) -> None:
        self.core.delete_namespaced_pod(name, NS, grace_period_seconds=grace)

    def versions(self, *names: str) -> dict[str, str]:
        """Each pod's resourceVersion: unchanged means nothing wrote it (the real plane's
        stand-in for the double's request log, for "sent no PATCH")."""
        return {n: self.get_pod(n)["metadata"]["resourceVersion"] for n in names}

    # --- reconcilers on real informers ----------------------------------------------------

    def informer(self, resource: str, selector: str = SELECTOR) -> Informer:
        api = self.kube.api
        if resource == "pods":
            made = Informer(CoreObjects(api, PODS), namespace=NS, label_selector=selector,
                            watch_seconds=30, name="test-pods")  # fmt: skip
        else:
            made = Informer(CoreObjects(api, NODES), watch_seconds=30, name="test-nodes")
        made.start()
        assert made.wait_synced(10)
        self.informers.append(made)
        return made

    def reconciler(
        self, source: Any = None, *, clock: Clock | None = None, nodes: bool = True,
        calls: Any = None, **overrides: Any,
    ) -> Reconciler:  # fmt: skip
        return new_reconciler(self, source, clock, nodes, calls, overrides)

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until the pod informers hold every pod as the API server has it now. (The
        double's informers can be compared with its store's revision, which its frequent
        bookmarks carry; here the revision moves with every write in the cluster, kwok's
        node heartbeats included, and bookmarks come about once a minute, so each pod's
        resourceVersion is compared instead.)"""
        for made in self.informers:
            if made.name != "test-pods":
                continue

            def caught_up(made: Informer = made) -> bool:
                # Listed again each time: kwok or a reconciler may move a pod meanwhile.
                listed = self.core.list_namespaced_pod(NS, label_selector=made._labels)
                want = {p.metadata.name: p.metadata.resource_version for p in listed.items}
                seen = {
                    o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in made.items()
                }
                return seen == want

            wait_until(caught_up, timeout=timeout, what=f"informer {made.name} to catch up")

    def close(self) -> None:
        """Stop the reconcilers and informers; ``real_kube`` deletes what the test made."""
        for made in self.reconcilers:
            made.close()
        for informer in self.informers:
            informer.stop()

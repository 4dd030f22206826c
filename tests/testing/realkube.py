"""The real control plane for tests: one per test process (each xdist worker starts its
own when its first test asks), shared by the tests that can share one, and put back as it
was after each of them (``RealKube.reset``): what a test made is deleted, what the plane
started with stays.

The plane runs etcd, kube-apiserver, kube-scheduler and kwok with one fake node (no
kube-controller-manager: no test needs its controllers, and a Deployment's pods would only
be churn), and has the project's CRDs and Karpenter's Established. Namespaces a test
makes stay (their deletion is the namespace controller's slow work); a test makes its
namespaces idempotently."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client, dynamic

from sandboxctl.lanes.guardkit import KARPENTER_CRDS
from sandboxctl_testing.controlplane import ControlPlane

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "manifests" / "crds"
PLANE_NODE = "kwok-node-0"
SYSTEM_NAMESPACE = "sandbox-system"
# The kinds a test may make, cluster-scoped or in any namespace; reset deletes what was not
# there when the plane started. (Events are left: they expire on their own.)
KINDS = (
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
    # Controllers before what they make, so that a pass leaves fewer pods to be made again.
    ("apps/v1", "Deployment"),
    ("apps/v1", "ReplicaSet"),
    ("apps/v1", "DaemonSet"),
    ("v1", "Pod"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("v1", "ServiceAccount"),
    ("v1", "Node"),
    ("policy/v1", "PodDisruptionBudget"),
    ("coordination.k8s.io/v1", "Lease"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    ("apiregistration.k8s.io/v1", "APIService"),
    ("sandbox.cocoonstack.io/v1beta1", "NodeInventory"),
    ("extensions.agents.x-k8s.io/v1beta1", "SandboxWarmPool"),
    ("extensions.agents.x-k8s.io/v1beta1", "SandboxTemplate"),
    ("karpenter.sh/v1", "NodePool"),
    ("karpenter.sh/v1", "NodeClaim"),
    ("karpenter.kwok.sh/v1alpha1", "KWOKNodeClass"),
)
# What kube-controller-manager makes in every namespace, and makes again once deleted.
KEPT = {("v1", "ServiceAccount"): "default", ("v1", "ConfigMap"): "kube-root-ca.crt"}
RESET_TIMEOUT = 30.0


def _kept(kind: tuple[str, str], obj: Any) -> bool:
    """What the plane's own controllers make and remake: a namespace's default account and
    CA bundle, and the APIService kube-apiserver registers for a CRD's group (it goes with
    the CRD)."""
    if kind == ("apiregistration.k8s.io/v1", "APIService"):
        return obj.spec.service is None
    return KEPT.get(kind) == obj.metadata.name


def _key(obj: Any) -> tuple[str, str]:
    return (obj.metadata.namespace or "", obj.metadata.name)


@dataclass
class RealKube:
    """The plane as a test sees it: the admin's URL, kubeconfig and official client."""

    plane: ControlPlane
    api: client.ApiClient
    baseline: dict[tuple[str, str], set[tuple[str, str]]] = field(default_factory=dict)
    resources: list[tuple[tuple[str, str], Any]] = field(default_factory=list)

    backend = "real"

    @property
    def url(self) -> str:
        return self.plane.url

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig

    def http(self) -> httpx.Client:
        return self.plane.http()

    def api_with_token(self, token: str) -> client.ApiClient:
        """An official client that shows ``token`` (a service account's, say)."""
        configuration = client.Configuration()
        configuration.host = self.url
        configuration.ssl_ca_cert = str(self.plane.ca.cert)
        configuration.api_key = {"authorization": f"Bearer {token}"}
        return client.ApiClient(configuration)

    def service_account_token(self, namespace: str, name: str) -> str:
        """A token for the service account, from the TokenRequest API (as a kubelet gets
        one for a pod)."""
        request = {"spec": {"audiences": [], "expirationSeconds": 3600}}
        with self.http() as http:
            answer = http.post(
                f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", json=request
            )
        answer.raise_for_status()
        token: str = answer.json()["status"]["token"]
        return token

    def _resources(self) -> list[tuple[tuple[str, str], Any]]:
        """Each kind's dynamic resource, found once (discovery is a dozen requests)."""
        if not self.resources:
            dyn = dynamic.DynamicClient(self.api)
            self.resources = [
                (kind, dyn.resources.get(api_version=kind[0], kind=kind[1])) for kind in KINDS
            ]
        return self.resources

    def record_baseline(self) -> None:
        for kind, resource in self._resources():
            self.baseline[kind] = {_key(o) for o in resource.get().items}

    def reset(self) -> None:
        """Delete what a test made (finalizers removed first), pass after pass until a pass
        finds nothing beyond what the plane started with: what a controller makes while
        its owner goes (a ReplicaSet's next pod) is caught by the next pass."""
        deadline = time.monotonic() + RESET_TIMEOUT
        while extra := self._extra():
            if time.monotonic() > deadline:
                named = ", ".join(f"{r.kind} {ns}/{n}" for r, ns, n, _ in extra[:5])
                raise AssertionError(f"outlived the reset: {named}")
            for resource, namespace, name, finalizers in extra:
                with contextlib.suppress(client.ApiException):
                    if finalizers:
                        resource.patch(
                            name=name, namespace=namespace or None,
                            body={"metadata": {"finalizers": None}},
                            content_type="application/merge-patch+json",
                        )  # fmt: skip
                    resource.delete(
                        name=name, namespace=namespace or None, body={"gracePeriodSeconds": 0}
                    )
            time.sleep(0.1)  # the deletions take effect (kwok's, the garbage collector's)

    def _extra(self) -> list[tuple[Any, str, str, bool]]:
        """What exists beyond the baseline: (resource, namespace, name, has finalizers)."""
        found = []
        for kind, resource in self._resources():
            for obj in resource.get().items:
                namespace, name = _key(obj)
                if (namespace, name) not in self.baseline[kind] and not _kept(kind, obj):
                    found.append((resource, namespace, name, bool(obj.metadata.finalizers)))
        return found


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(
        tmp_path_factory.mktemp("control-plane"),
        crds=[CRDS, KARPENTER_CRDS],
        scheduler=True,
        kwok=True,
    )
    with plane:
        yield plane


@pytest.fixture(scope="session")
def _real_kube(control_plane: ControlPlane) -> Iterator[RealKube]:
    api = control_plane.api()
    # The namespace the manifests make (manifests/base/namespace.yaml), where the API
    # servers' Lease lives.
    client.CoreV1Api(api).create_namespace({"metadata": {"name": SYSTEM_NAMESPACE}})
    real = RealKube(control_plane, api)
    real.record_baseline()
    yield real
    api.close()


@pytest.fixture
def real_kube(_real_kube: RealKube) -> Iterator[RealKube]:
    """The shared plane, put back as it was after the test: started again where a failed
    outage test left a part stopped (else every later test of the worker would fail), and
    rid of what the test made."""
    yield _real_kube
    plane = _real_kube.plane
    if not plane.etcd.running:
        plane.start_etcd()
    if not plane.apiserver.running:
        plane.start_apiserver()
    _real_kube.reset()


@pytest.fixture
def kube(real_kube: RealKube) -> RealKube:
    """What a Kubernetes test runs against: the real control plane."""
    return real_kube


@pytest.fixture(scope="module")
def uncached_kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealKube]:
    """A plane of its own (for the module) whose kube-apiserver serves watches from etcd,
    without its watch cache, so that an etcd compaction expires a watch's cursor with 410:
    with the cache, a watch is served from memory whatever etcd compacted."""
    plane = ControlPlane(tmp_path_factory.mktemp("uncached"), crds=[CRDS], watch_cache=False)
    with plane:
        api = plane.api()
        yield RealKube(plane, api)
        api.close()

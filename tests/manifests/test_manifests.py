"""Every manifest is checked: kustomize builds the base and the small-cluster overlay,
each object validates against the upstream schemas (strict), the server takes them
(``kubectl apply``, with ``--dry-run=server`` and for real, against the real control
plane), the RBAC is least privilege (SubjectAccessReviews against the applied roles), each
component works with its own service account's token (from the TokenRequest API), and the
systemd units verify with flags the commands have."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes import client

from sandboxctl.core.model import NodeInventory
from sandboxctl.inventory.kube import KubeInventorySource
from sandboxctl.kube import NODE_INVENTORIES, SANDBOX_WARM_POOLS, CustomObjects, LeaderElector
from sandboxctl.publisher import published_object
from tests.testing.kubeapi.double import PINNED_KUBECTL, REPO, Kubectl, second_kubectl
from tests.testing.realkube import RealKube

MANIFESTS = REPO / "manifests"
TREES = ("base", "overlays/small")
NEEDS_KUBECTL = pytest.mark.skipif(
    not PINNED_KUBECTL.exists(), reason="needs the pinned kubectl (make kubectl)"
)
NI = ("sandbox.cocoonstack.io", "v1beta1", "nodeinventories")


def build(tree: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [str(PINNED_KUBECTL), "kustomize", str(MANIFESTS / tree)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@NEEDS_KUBECTL
@pytest.mark.parametrize("tree", TREES)
def test_every_object_validates_against_the_upstream_schemas(tree: str) -> None:
    objects = build(tree)
    kinds = {o["kind"] for o in objects}
    assert {
        "CustomResourceDefinition",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "APIService",
        "ClusterRole",
        "Role",
        "ServiceAccount",
        "Namespace",
    } <= kinds
    for obj in objects:
        kubernetes_validate.validate(obj, "1.35.0", strict=True)


@NEEDS_KUBECTL
def test_the_small_overlay_runs_one_replica_and_never_blocks_a_drain() -> None:
    objects = {(o["kind"], o["metadata"]["name"]): o for o in build("overlays/small")}
    assert objects[("Deployment", "sandboxctl-apiserver")]["spec"]["replicas"] == 1
    assert objects[("Deployment", "sandboxctl-proxy")]["spec"]["replicas"] == 1
    assert objects[("PodDisruptionBudget", "sandboxctl-apiserver")]["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": {"app.kubernetes.io/name": "sandboxctl-apiserver"}},
    }
    base = {(o["kind"], o["metadata"]["name"]): o for o in build("base")}
    assert base[("Deployment", "sandboxctl-apiserver")]["spec"]["replicas"] == 2


def _kubectls() -> list[Any]:
    second = second_kubectl()
    return [
        pytest.param(PINNED_KUBECTL, id="kubectl-1.35"),
        pytest.param(
            second,
            id="kubectl-1.32",
            marks=pytest.mark.skipif(second is None, reason="no kubectl 1.32 here"),
        ),
    ]


@NEEDS_KUBECTL
@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("binary", _kubectls())
def test_apply_dry_run_server_stores_nothing(
    tree: str, binary: Path, kube: RealKube, tmp_path: Path
) -> None:
    kubectl = Kubectl(binary, kube.kubeconfig, tmp_path)
    applied = kubectl("apply", "--dry-run=server", "-k", str(MANIFESTS / tree), timeout=60)
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.count("(server dry run)") == len(build(tree))
    # Nothing was stored:
    assert kubectl("get", "deployments", "-n", NAMESPACE, "-o", "name").stdout.split() == []
    assert kubectl("get", "apiservice", APISERVICE).returncode != 0


@NEEDS_KUBECTL
@pytest.mark.parametrize("tree", TREES)
def test_apply_for_real_makes_every_object(tree: str, kube: RealKube, tmp_path: Path) -> None:
    kubectl = Kubectl(PINNED_KUBECTL, kube.kubeconfig, tmp_path)
    applied = kubectl("apply", "-k", str(MANIFESTS / tree), timeout=60)
    assert applied.returncode == 0, applied.stderr
    stored = stored_objects(kubectl, tree)
    assert sorted(stored) == sorted(
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in build(tree)
    )
    again = kubectl("apply", "-k", str(MANIFESTS / tree), timeout=60)
    assert again.returncode == 0, again.stderr
    # A second apply changes nothing (kubectl still says "configured" of the PDB: its
    # selector's patch is sent whole, and the server finds nothing to change).
    assert stored_objects(kubectl, tree) == stored


def stored_objects(kubectl: Kubectl, tree: str) -> dict[tuple[str, str, str], Any]:
    """What the server holds of the tree's objects: each one's generation and spec."""
    got = kubectl("get", "-k", str(MANIFESTS / tree), "-o", "json", timeout=60)
    assert got.returncode == 0, got.stderr
    return {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): (
            o["metadata"].get("generation"),
            o.get("spec"),
        )
        for o in json.loads(got.stdout)["items"]
    }


@NEEDS_KUBECTL
def test_a_broken_manifest_is_refused_by_the_dry_run(kube: RealKube, tmp_path: Path) -> None:
    kubectl = Kubectl(PINNED_KUBECTL, kube.kubeconfig, tmp_path)
    bad = yaml.safe_load((MANIFESTS / "base" / "apiserver.yaml").read_text().split("---")[0])
    bad["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "https"
    refused = kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(bad))
    assert refused.returncode != 0
    # kube-apiserver cannot even decode it: 400, naming the field (not 422 Invalid)
    assert "BadRequest" in refused.stderr
    assert "containerPort" in refused.stderr


# --- RBAC ------------------------------------------------------------------------------------

PARTS = ("apiserver", "proxy", "publisher")
NAMESPACE = "sandbox-system"
APISERVICE = "v1beta1.agents.x-k8s.io"


@dataclass
class Installed:
    kube: RealKube
    clients: dict[str, client.ApiClient]  # each part's, with its service account's token


@pytest.fixture
def installed(kube: RealKube, tmp_path: Path) -> Iterator[Installed]:
    """The base manifests applied, and a token for each part's service account."""
    kubectl = Kubectl(PINNED_KUBECTL, kube.kubeconfig, tmp_path)
    applied = kubectl("apply", "-k", str(MANIFESTS / "base"), timeout=60)
    assert applied.returncode == 0, applied.stderr
    clients = {
        part: kube.api_with_token(kube.service_account_token(NAMESPACE, f"sandboxctl-{part}"))
        for part in PARTS
    }
    yield Installed(kube, clients)
    for api in clients.values():
        api.close()


def may(
    kube: RealKube,
    account: str,
    verb: str,
    resource: str,
    group: str,
    namespace: str = "",
    name: str = "",
) -> bool:
    spec = client.V1SubjectAccessReviewSpec(
        user=f"system:serviceaccount:sandbox-system:sandboxctl-{account}",
        groups=["system:serviceaccounts", "system:authenticated"],
        resource_attributes=client.V1ResourceAttributes(
            verb=verb,
            group=group,
            resource=resource.split("/")[0],
            subresource=resource.split("/")[1] if "/" in resource else None,
            namespace=namespace or None,
            name=name or None,
        ),
    )
    review = client.AuthorizationV1Api(kube.api).create_subject_access_review(
        client.V1SubjectAccessReview(spec=spec)
    )
    return bool(review.status.allowed)


SI, EXT, CO = "sandbox.cocoonstack.io", "extensions.agents.x-k8s.io", "coordination.k8s.io"


RIGHTS = [
    ("publisher", "patch", "nodeinventories", SI, "", "node-a", True),
    ("publisher", "create", "nodeinventories", SI, "", "", True),
    ("publisher", "delete", "nodeinventories", SI, "", "node-a", False),
    ("publisher", "list", "nodeinventories", SI, "", "", False),
    ("publisher", "get", "secrets", "", "sandbox-system", "", False),
    ("proxy", "watch", "nodeinventories", SI, "", "", True),
    ("proxy", "patch", "nodeinventories", SI, "", "node-a", False),
    ("proxy", "list", "sandboxwarmpools", EXT, "", "", False),
    ("apiserver", "list", "sandboxwarmpools", EXT, "", "", True),
    ("apiserver", "watch", "sandboxtemplates", EXT, "", "", True),
    ("apiserver", "patch", "sandboxwarmpools/status", EXT, "team", "p", True),
    ("apiserver", "patch", "sandboxwarmpools", EXT, "team", "p", False),
    ("apiserver", "update", "leases", CO, "sandbox-system", "sandboxctl-warm-pool-driver", True),
    ("apiserver", "update", "leases", CO, "sandbox-system", "another-lease", False),
    ("apiserver", "update", "leases", CO, "kube-system", "sandboxctl-warm-pool-driver", False),
    ("apiserver", "create", "subjectaccessreviews", "authorization.k8s.io", "", "", True),
    ("apiserver", "create", "tokenreviews", "authentication.k8s.io", "", "", False),
    ("apiserver", "delete", "nodeinventories", SI, "", "node-a", False),
]


@NEEDS_KUBECTL
def test_rbac_is_least_privilege(installed: Installed) -> None:
    """Each row at once (one install): (account, verb, resource, group, namespace, name,
    allowed)."""
    wrong = [row for row in RIGHTS if may(installed.kube, *row[:-1]) is not row[-1]]
    assert wrong == []


@NEEDS_KUBECTL
def test_each_component_works_with_its_own_account(installed: Installed) -> None:
    clients = installed.clients
    stamp = datetime(2026, 11, 30, 4, 0, tzinfo=UTC)
    publisher = CustomObjects(clients["publisher"], NODE_INVENTORIES)
    publisher.apply(
        published_object(NodeInventory(node="node-a", published_at=stamp)), "sandboxctl-publish"
    )
    source = KubeInventorySource(clients["proxy"], sync_timeout=timedelta(seconds=5))
    source.start()
    try:
        assert source.snapshot().nodes == ("node-a",)
    finally:
        source.stop()
    apiserver = clients["apiserver"]
    assert CustomObjects(apiserver, SANDBOX_WARM_POOLS).list().items == []
    elector = LeaderElector(
        apiserver, "sandbox-system", "sandboxctl-warm-pool-driver", "me", lambda: None, lambda: None
    )
    assert elector._try()
    assert elector._try()


# --- systemd ----------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
@pytest.mark.parametrize("unit", ["sandboxctl-sandboxd.service", "sandboxctl-publish.service"])
def test_systemd_units_verify_and_name_real_flags(unit: str, tmp_path: Path) -> None:
    text = (MANIFESTS / "systemd" / unit).read_text()
    command = re.search(r"sandboxctl (\S+) \\", text)
    assert command is not None
    flags = set(re.findall(r"(--[a-z0-9-]+)", text.split("ExecStart=", 1)[1].split("\n#", 1)[0]))
    usage = subprocess.run(
        [sys.executable, "-m", "sandboxctl", command.group(1), "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert flags
    assert {f for f in flags if f not in usage} == set()
    local = tmp_path / unit
    local.write_text(
        text.replace(
            "/opt/sandboxctl/bin/sandboxctl", str(Path(sys.executable).parent / "sandboxctl")
        )
    )
    verified = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(local)], capture_output=True, text=True
    )
    problems = [
        line
        for line in verified.stderr.splitlines()
        if unit in line and "EnvironmentFile" not in line
    ]
    assert problems == [], verified.stderr

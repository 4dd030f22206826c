"""Every manifest is checked: kustomize builds the base and the small-cluster overlay,
each object validates against the upstream schemas (strict), the server takes them
(``kubectl apply --dry-run=server`` against the double, which enforces the CRD schemas
and reads built-in kinds back through the client's models), the RBAC is least privilege
(SubjectAccessReviews against the double), each component works with its own account,
and the systemd units verify with flags the commands have."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
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
from sandboxctl_testing.kubeapi.access import load_tokens
from tests.testing.kubeapi.double import (
    PINNED_KUBECTL,
    REPO,
    Kube,
    Kubectl,
    api_for,
    second_kubectl,
)

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
def test_apply_dry_run_server_against_the_double(
    tree: str, binary: Path, kube: Kube, tmp_path: Path
) -> None:
    kubectl = Kubectl(binary, kube.kubeconfig, tmp_path)
    before = kube.store.rv
    applied = kubectl("apply", "--dry-run=server", "-k", str(MANIFESTS / tree), timeout=60)
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.count("(server dry run)") == len(build(tree))
    assert kube.store.rv == before  # nothing was stored


@NEEDS_KUBECTL
def test_a_broken_manifest_is_refused_by_the_dry_run(kube: Kube, tmp_path: Path) -> None:
    kubectl = Kubectl(PINNED_KUBECTL, kube.kubeconfig, tmp_path)
    bad = yaml.safe_load((MANIFESTS / "base" / "apiserver.yaml").read_text().split("---")[0])
    bad["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "https"
    refused = kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(bad))
    assert refused.returncode != 0
    assert "Invalid" in refused.stderr or "invalid" in refused.stderr


# --- RBAC ------------------------------------------------------------------------------------

ACCOUNTS = {"apiserver": "t-apiserver", "proxy": "t-proxy", "publisher": "t-publisher"}


@pytest.fixture
def installed(kube: Kube, tmp_path: Path) -> Kube:
    """The base manifests' RBAC stored in the double, and a token per service account."""
    rbac = [
        o
        for o in build("base")
        if o["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    ]
    for obj in rbac:
        group_version, plural = obj["apiVersion"], obj["kind"].lower() + "s"
        namespace = obj["metadata"].get("namespace")
        path = (
            f"/apis/{group_version}/" + (f"namespaces/{namespace}/" if namespace else "") + plural
        )
        answer = kube.api.call_api(
            "POST", kube.url + path, header_params={"Content-Type": "application/json"}, body=obj
        )
        answer.read()
        assert answer.status == 201, answer.data
    tokens = tmp_path / "tokens.csv"
    tokens.write_text(
        "".join(
            f'{token},system:serviceaccount:sandbox-system:sandboxctl-{name},u-{name},"system:serviceaccounts"\n'
            for name, token in ACCOUNTS.items()
        )
    )
    kube.running.server.settings.tokens.update(load_tokens(tokens))
    return kube


def may(
    kube: Kube,
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


@NEEDS_KUBECTL
@pytest.mark.parametrize(
    ("account", "verb", "resource", "group", "namespace", "name", "allowed"),
    [
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
        (
            "apiserver",
            "update",
            "leases",
            CO,
            "sandbox-system",
            "sandboxctl-warm-pool-driver",
            True,
        ),
        ("apiserver", "update", "leases", CO, "sandbox-system", "another-lease", False),
        ("apiserver", "update", "leases", CO, "kube-system", "sandboxctl-warm-pool-driver", False),
        ("apiserver", "create", "subjectaccessreviews", "authorization.k8s.io", "", "", True),
        ("apiserver", "create", "tokenreviews", "authentication.k8s.io", "", "", False),
        ("apiserver", "delete", "nodeinventories", SI, "", "node-a", False),
    ],
)
def test_rbac_is_least_privilege(
    installed: Kube,
    account: str,
    verb: str,
    resource: str,
    group: str,
    namespace: str,
    name: str,
    allowed: bool,
) -> None:
    assert may(installed, account, verb, resource, group, namespace, name) is allowed


@NEEDS_KUBECTL
def test_each_component_works_with_its_own_account(installed: Kube) -> None:
    url = installed.url
    stamp = datetime(2026, 11, 30, 4, 0, tzinfo=UTC)
    publisher = CustomObjects(api_for(url, ACCOUNTS["publisher"]), NODE_INVENTORIES)
    publisher.apply(
        published_object(NodeInventory(node="node-a", published_at=stamp)), "sandboxctl-publish"
    )
    source = KubeInventorySource(api_for(url, ACCOUNTS["proxy"]), sync_timeout=timedelta(seconds=5))
    source.start()
    try:
        assert source.snapshot().nodes == ("node-a",)
    finally:
        source.stop()
    apiserver = api_for(url, ACCOUNTS["apiserver"])
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

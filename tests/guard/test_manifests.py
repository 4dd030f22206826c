"""The guard's manifests: kustomize builds them, each object validates against the
upstream schemas, a real kube-apiserver takes them (server dry run), the RBAC is least
privilege (SubjectAccessReviews, judged by kube-apiserver's own RBAC authorizer), the guard
works with its own account (a client certificate naming it), and the systemd unit verifies
with flags the command has."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes import client

from sandboxctl.guard.decide import Busy
from sandboxctl.guard.service import Guard
from sandboxctl.kube import api_client
from tests.guard.cluster import StaticSource, settings
from tests.guard.realcluster import RealCluster
from tests.testing.kubeapi.double import PINNED_KUBECTL, REPO, Kubectl

GUARD = REPO / "manifests" / "guard"
UNIT = REPO / "manifests" / "systemd" / "sandboxctl-guard-workers.service"
ACCOUNT = "system:serviceaccount:sandbox-system:sandboxctl-guard-workers"
ACCOUNT_GROUPS = ["system:serviceaccounts", "system:serviceaccounts:sandbox-system"]
NEEDS_KUBECTL = pytest.mark.skipif(
    not PINNED_KUBECTL.exists(), reason="needs the pinned kubectl (make kubectl)"
)


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def built() -> list[dict[str, Any]]:
    out = subprocess.run([str(PINNED_KUBECTL), "kustomize", str(GUARD)], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out) if doc]


def test_rbac_includes_worker_pod_patch() -> None:
    (role,) = [d for d in documents(GUARD / "rbac.yaml") if d["kind"] == "Role"]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "patch", "watch"]}
    ]


@NEEDS_KUBECTL
def test_every_object_validates_against_the_upstream_schemas() -> None:
    objects = built() + documents(GUARD / "rbac-sandbox-hosts.yaml")
    kinds = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    assert {o["kind"] for o in objects} == kinds | {"Deployment"}
    for obj in objects:
        kubernetes_validate.validate(obj, "1.35.0", strict=True)
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["guard-workers", "run"]
    assert {a.split("=", 1)[0] for a in args[2:]} <= set(_run_flags())


@NEEDS_KUBECTL
def test_apply_dry_run_server(real_cluster: RealCluster, tmp_path: Path) -> None:
    # The workers' namespace exists (real_cluster makes it): a real kube-apiserver refuses
    # objects in a namespace that does not, as the double did not.
    kubectl = Kubectl(PINNED_KUBECTL, real_cluster.kube.kubeconfig, tmp_path)
    applied = kubectl("apply", "--dry-run=server", "-k", str(GUARD), timeout=60)
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.count("(server dry run)") == len(built())
    listed = kubectl("get", "-k", str(GUARD), "--ignore-not-found", "-o", "name", timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.strip() == ""  # a dry run stores nothing


@pytest.fixture
def installed(real_cluster: RealCluster) -> RealCluster:
    """The guard's RBAC created for real (its ServiceAccount aside: the account is a client
    certificate naming it, see ``account_api``)."""
    cluster = real_cluster
    objects = documents(GUARD / "rbac.yaml") + documents(GUARD / "rbac-sandbox-hosts.yaml")
    for obj in objects:
        if obj["kind"] == "ServiceAccount":
            continue
        namespace = obj["metadata"].get("namespace")
        path = f"/apis/{obj['apiVersion']}/" + (f"namespaces/{namespace}/" if namespace else "")
        url = cluster.kube.url + path + obj["kind"].lower() + "s"
        json_body = {"Content-Type": "application/json"}
        answer = cluster.kube.api.call_api("POST", url, header_params=json_body, body=obj)
        answer.read()
        assert answer.status == 201, answer.data
    return cluster


def may(
    cluster: RealCluster, verb: str, resource: str, group: str = "", namespace: str = ""
) -> bool:
    attributes = client.V1ResourceAttributes(
        verb=verb, group=group, resource=resource, namespace=namespace or None
    )
    spec = client.V1SubjectAccessReviewSpec(
        user=ACCOUNT,
        groups=["system:serviceaccounts", "system:authenticated"],
        resource_attributes=attributes,
    )
    review = client.AuthorizationV1Api(cluster.kube.api).create_subject_access_review(
        client.V1SubjectAccessReview(spec=spec)
    )
    return bool(review.status.allowed)


@pytest.mark.parametrize(
    ("verb", "resource", "group", "namespace", "allowed"),
    [
        ("patch", "pods", "", "workers", True),
        ("watch", "pods", "", "workers", True),
        ("get", "pods", "", "workers", True),
        ("delete", "pods", "", "workers", False),  # never evicts, never deletes
        ("create", "pods", "", "workers", False),
        ("update", "pods", "", "workers", False),
        ("patch", "pods", "", "default", False),  # only the workers' namespace
        ("create", "pods/eviction", "", "workers", False),
        ("watch", "nodes", "", "", True),
        ("patch", "nodes", "", "", False),
        ("list", "nodepools", "karpenter.sh", "", True),
        ("patch", "nodepools", "karpenter.sh", "", False),
        ("list", "nodeclaims", "karpenter.sh", "", True),
        ("delete", "nodeclaims", "karpenter.sh", "", False),
        ("watch", "nodeinventories", "sandbox.cocoonstack.io", "", True),
        ("patch", "nodeinventories", "sandbox.cocoonstack.io", "", False),
        ("get", "secrets", "", "workers", False),
    ],
)
def test_rbac_is_least_privilege(
    installed: RealCluster, verb: str, resource: str, group: str, namespace: str, allowed: bool
) -> None:
    assert may(installed, verb, resource, group, namespace) is allowed


def test_the_guard_works_with_its_own_account(installed: RealCluster) -> None:
    installed.nodepool("workers", grace="1h")
    installed.node("node-a")
    installed.pod("w1")
    source = StaticSource()
    source.busy["w1"] = Busy.BUSY
    api = api_client(installed.kube.plane.kubeconfig_for(ACCOUNT, ACCOUNT_GROUPS))
    guard = Guard(settings(), api, lambda pods, on_verdict: source,
                  sync_timeout=timedelta(seconds=20), watch_seconds=30)  # fmt: skip
    try:
        assert guard.start()
        assert guard.gate().verdict.value == "ok"
        guard.reconciler.tick()
        assert installed.annotation("w1") == "true"
    finally:
        guard.close()
        api.close()


def _run_flags() -> list[str]:
    usage = subprocess.run([sys.executable, "-m", "sandboxctl", "guard-workers", "run", "--help"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    return re.findall(r"(--[a-z0-9-]+)", usage)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_the_systemd_unit_verifies_and_names_real_flags(tmp_path: Path) -> None:
    text = UNIT.read_text()
    command = text.split("ExecStart=", 1)[1].split("\n#", 1)[0]
    flags = set(re.findall(r"(--[a-z0-9-]+)", command))
    assert "guard-workers run" in command
    assert flags
    assert flags - set(_run_flags()) == set()
    local = tmp_path / UNIT.name
    local.write_text(text.replace("/opt/sandboxctl/bin/sandboxctl",
                                  str(Path(sys.executable).parent / "sandboxctl")))  # fmt: skip
    verified = subprocess.run(["systemd-analyze", "verify", "--man=no", str(local)],
                              capture_output=True, text=True)  # fmt: skip
    problems = [line for line in verified.stderr.splitlines()
                if UNIT.name in line and "EnvironmentFile" not in line]  # fmt: skip
    assert problems == [], verified.stderr
    env = (REPO / "manifests" / "systemd" / "guard-workers.env.example").read_text()
    used = set(re.findall(r"\$\{?(GUARD_[A-Z_]+)", command))
    assert used <= set(re.findall(r"^(GUARD_[A-Z_]+)=", env, re.MULTILINE))

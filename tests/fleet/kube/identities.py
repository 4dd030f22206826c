"""Who each part of a fleet is to the real control plane, and what it may do there.

Every part authenticates with a client certificate of its own whose user is its service
account's name (``system:serviceaccount:sandbox-system:NAME``); RBAC's ServiceAccount
subjects match that name, so the roles and bindings of ``manifests/base/rbac-*.yaml``,
applied with kubectl as kustomize would place them (namespace ``sandbox-system``), are
the only rights a part has. A test that passes therefore proves that the parts need no
more than the manifests grant.
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client

from sandboxctl_testing.controlplane import ControlPlane

REPO = Path(__file__).resolve().parents[3]
KUBECTL = REPO / ".tools" / "bin" / "kubectl"
NAMESPACE = "sandbox-system"  # the kustomization's namespace
BASE = REPO / "manifests" / "base"
RBAC_FILES = tuple(BASE / f"rbac-{part}.yaml" for part in ("apiserver", "proxy", "publisher"))
SERVICE_ACCOUNT_GROUPS = ("system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}")


def ensure_namespace(api: client.ApiClient, name: str) -> None:
    """Make ``name`` unless it is there (the shared plane keeps namespaces across tests)."""
    body = client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
    try:
        client.CoreV1Api(api).create_namespace(body)
    except client.ApiException as error:
        if error.status != 409:
            raise


def kubectl(
    kubeconfig: Path, *args: str, check: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The pinned kubectl with ``kubeconfig``; its output as text. Its discovery cache is
    its own, so that no call reads what an earlier test's plane served."""
    with tempfile.TemporaryDirectory(prefix="kubectl-cache-") as cache:
        return subprocess.run(
            [str(KUBECTL), f"--kubeconfig={kubeconfig}", f"--cache-dir={cache}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=check,
        )


def service_account_user(name: str) -> str:
    return f"system:serviceaccount:{NAMESPACE}:{name}"


@dataclass(frozen=True)
class Identities:
    """The kubeconfigs of the parts, each a user the manifests' RBAC names."""

    publisher: Path
    apiserver: Path
    proxy: Path


def grant_manifest_rights(plane: ControlPlane) -> Identities:
    """Apply the manifests' RBAC (with kubectl, as an operator would) and make one
    kubeconfig per part, as its service account."""
    with plane.api() as api:
        ensure_namespace(api, NAMESPACE)
    files = [f"--filename={path}" for path in RBAC_FILES]
    kubectl(plane.kubeconfig, "apply", f"--namespace={NAMESPACE}", *files)
    parts = ("publisher", "apiserver", "proxy")
    users = {part: service_account_user(f"sandboxctl-{part}") for part in parts}
    return Identities(
        **{part: plane.kubeconfig_for(user, SERVICE_ACCOUNT_GROUPS) for part, user in users.items()}
    )


def can_i(kubeconfig: Path, verb: str, resource: str, *flags: str, namespace: str = "") -> bool:
    """``kubectl auth can-i`` as the kubeconfig's user (exit 0: yes, 1: no)."""
    where = [f"--namespace={namespace}"] if namespace else ["--all-namespaces"]
    answer = kubectl(kubeconfig, "auth", "can-i", verb, resource, *flags, *where, check=False)
    if answer.returncode not in (0, 1):
        raise AssertionError(f"kubectl auth can-i failed: {answer.stderr}")
    return answer.returncode == 0

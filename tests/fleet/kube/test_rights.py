"""The rights the fleet's parts run with (tests/fleet/kube/identities.py: the manifests'
RBAC, each part its service account), as ``kubectl auth can-i`` reads them from the real
RBAC: what each part needs, and none of what it must not have. The fleet tests show that
the parts work with these rights; this shows the rights are no wider."""

from __future__ import annotations

from tests.fleet.kube.identities import NAMESPACE, can_i, grant_manifest_rights
from tests.testing.realkube import RealKube

INVENTORIES = "nodeinventories.sandbox.cocoonstack.io"
POOLS = "sandboxwarmpools.extensions.agents.x-k8s.io"
TEMPLATES = "sandboxtemplates.extensions.agents.x-k8s.io"
LEASES = "leases.coordination.k8s.io"
DRIVER_LEASE = f"{LEASES}/sandboxctl-warm-pool-driver"
REVIEWS = "subjectaccessreviews.authorization.k8s.io"
# (part, verb, resource, namespace or "" for all, allowed)
RIGHTS = [
    ("publisher", "create", INVENTORIES, "", True),
    ("publisher", "patch", INVENTORIES, "", True),
    ("publisher", "get", INVENTORIES, "", False),
    ("publisher", "delete", INVENTORIES, "", False),
    ("publisher", "list", POOLS, "", False),
    ("apiserver", "watch", INVENTORIES, "", True),
    ("apiserver", "patch", INVENTORIES, "", False),
    ("apiserver", "list", TEMPLATES, "", True),
    ("apiserver", "patch", f"{POOLS} --subresource=status", "", True),
    ("apiserver", "patch", POOLS, "", False),
    ("apiserver", "create", REVIEWS, "", True),
    ("apiserver", "create", LEASES, NAMESPACE, True),
    ("apiserver", "update", DRIVER_LEASE, NAMESPACE, True),
    ("apiserver", "update", f"{LEASES}/another", NAMESPACE, False),
    ("apiserver", "create", LEASES, "default", False),
    ("apiserver", "list", "secrets", NAMESPACE, False),
    ("proxy", "list", INVENTORIES, "", True),
    ("proxy", "create", INVENTORIES, "", False),
    ("proxy", "list", POOLS, "", False),
]


def test_each_part_has_the_manifests_rights_and_no_more(kube: RealKube) -> None:
    identities = grant_manifest_rights(kube.plane)
    wrong = []
    for part, verb, resource, namespace, allowed in RIGHTS:
        kubeconfig = getattr(identities, part)
        name, *flags = resource.split()
        if can_i(kubeconfig, verb, name, *flags, namespace=namespace) != allowed:
            wrong.append((part, verb, resource, namespace or "*", allowed))
    assert wrong == []

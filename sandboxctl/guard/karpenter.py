"""Reading what the NodePool audit needs from the cluster (read-only): NodePools and
NodeClaims (``karpenter.sh/v1``), Nodes, and the guarded pods.

Needs cluster-scoped get and list on ``nodepools.karpenter.sh``, ``nodeclaims.karpenter.sh``
and ``nodes``. A cluster that serves no NodePools (Karpenter is not installed) is not an
error: the audit says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from kubernetes import client

from sandboxctl.core.errors import ConfigurationError
from sandboxctl.guard.audit import (
    AuditInput,
    ClaimView,
    NodePoolSpec,
    Worker,
    claim_view,
    nodepool_spec,
)
from sandboxctl.guard.pods import NodeView, PodView, node_view
from sandboxctl.kube import (
    NODECLAIMS,
    NODEPOOLS,
    NODES,
    CoreObjects,
    CustomObjects,
    KubeForbidden,
    KubeNotFound,
)


class AuditReadError(ConfigurationError):
    """The audit may not read what it needs (one line naming the grant)."""


def workers_of(pods: Sequence[PodView]) -> list[Worker]:
    return [
        Worker(f"{p.namespace}/{p.name}", p.node, p.annotated, p.grace_seconds)
        for p in pods
        if not p.terminal
    ]


def read_audit_input(
    api: client.ApiClient,
    pods: Sequence[PodView],
    *,
    configured: Sequence[str] = (),
    guard_enabled: bool = True,
    max_roll: timedelta | None = None,
    nodes: Sequence[NodeView] | None = None,
) -> AuditInput:
    """Everything the audit reads; ``nodes`` may come from an informer's cache."""
    try:
        listed = CustomObjects(api, NODEPOOLS).list()
    except KubeNotFound:
        return AuditInput({}, workers_of(pods), configured=configured, nodepool_api=False,
                          guard_enabled=guard_enabled, max_roll=max_roll)  # fmt: skip
    except KubeForbidden as error:
        raise _forbidden(error) from None
    nodepools: dict[str, NodePoolSpec] = {}
    for obj in listed.items:
        spec = nodepool_spec(obj)
        nodepools[spec.name] = spec
    claims: list[ClaimView] = []
    try:
        claims = [claim_view(obj) for obj in CustomObjects(api, NODECLAIMS).list().items]
    except KubeNotFound:
        claims = []
    except KubeForbidden as error:
        raise _forbidden(error) from None
    if nodes is None:
        try:
            nodes = [node_view(obj) for obj in CoreObjects(api, NODES).list().items]
        except KubeForbidden as error:
            raise _forbidden(error) from None
    return AuditInput(
        nodepools,
        workers_of(pods),
        {n.name: n for n in nodes},
        claims,
        configured=configured,
        guard_enabled=guard_enabled,
        max_roll=max_roll,
    )


def _forbidden(error: KubeForbidden) -> AuditReadError:
    return AuditReadError(
        f"the NodePool audit may not read what it needs ({error}): grant get and list on "
        "nodepools.karpenter.sh, nodeclaims.karpenter.sh and nodes (manifests/guard/rbac.yaml)"
    )

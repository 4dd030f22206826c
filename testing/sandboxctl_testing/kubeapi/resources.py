"""The resource types the double serves: the built-in kinds sandboxctl's manifests and
code use, and the custom ones registered from CustomResourceDefinitions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
CREATE_ONLY = ("create",)
NAME_FIELDS = frozenset({"metadata.name", "metadata.namespace"})


@dataclass(frozen=True, slots=True)
class Column:
    """A printer column: ``path`` is a simple JSONPath such as ``.status.phase``."""

    name: str
    type: str
    path: str
    description: str = ""
    format: str = ""
    priority: int = 0


@dataclass(frozen=True, slots=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    status: bool = False
    columns: tuple[Column, ...] = ()
    verbs: tuple[str, ...] = ALL_VERBS
    model: str | None = None  # the official client's model, which must read a write back
    schema: Mapping[str, Any] | None = field(default=None, compare=False)  # a CRD's schema
    fields: frozenset[str] = NAME_FIELDS

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def storage(self) -> tuple[str, str]:
        """Objects are kept per group and plural, whatever version reads them."""
        return (self.group, self.plural)

    @property
    def qualified(self) -> str:
        """``plural.group`` as Status messages name it."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def stored(self) -> bool:
        """Review kinds answer a create and keep nothing."""
        return self.verbs != CREATE_ONLY


def _builtin(
    group: str,
    version: str,
    plural: str,
    kind: str,
    namespaced: bool,
    model: str,
    *,
    short: tuple[str, ...] = (),
    status: bool = False,
    verbs: tuple[str, ...] = ALL_VERBS,
    fields: frozenset[str] = NAME_FIELDS,
) -> ResourceType:
    return ResourceType(
        group,
        version,
        plural,
        kind,
        namespaced,
        singular=kind.lower(),
        short_names=short,
        status=status,
        verbs=verbs,
        model=model,
        fields=fields,
    )


BUILTINS: tuple[ResourceType, ...] = (
    _builtin("", "v1", "namespaces", "Namespace", False, "V1Namespace", short=("ns",)),
    _builtin("", "v1", "configmaps", "ConfigMap", True, "V1ConfigMap", short=("cm",)),
    _builtin("", "v1", "secrets", "Secret", True, "V1Secret"),
    _builtin(
        "", "v1", "serviceaccounts", "ServiceAccount", True, "V1ServiceAccount", short=("sa",)
    ),
    _builtin("", "v1", "services", "Service", True, "V1Service", short=("svc",), status=True),
    _builtin(
        "",
        "v1",
        "pods",
        "Pod",
        True,
        "V1Pod",
        short=("po",),
        status=True,
        fields=NAME_FIELDS | {"spec.nodeName", "status.phase"},
    ),
    # Nodes: guard-workers reads their karpenter.sh/nodepool label and disruption taint.
    _builtin("", "v1", "nodes", "Node", False, "V1Node", short=("no",), status=True),
    _builtin(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        True,
        "V1Deployment",
        short=("deploy",),
        status=True,
    ),
    _builtin(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        True,
        "V1PodDisruptionBudget",
        short=("pdb",),
        status=True,
    ),
    _builtin("coordination.k8s.io", "v1", "leases", "Lease", True, "V1Lease"),
    _builtin("rbac.authorization.k8s.io", "v1", "roles", "Role", True, "V1Role"),
    _builtin(
        "rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False, "V1ClusterRole"
    ),
    _builtin(
        "rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True, "V1RoleBinding"
    ),
    _builtin(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        False,
        "V1ClusterRoleBinding",
    ),
    _builtin(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
        "V1CustomResourceDefinition",
        short=("crd", "crds"),
        status=True,
    ),
    _builtin(
        "apiregistration.k8s.io",
        "v1",
        "apiservices",
        "APIService",
        False,
        "V1APIService",
        status=True,
    ),
    _builtin(
        "authentication.k8s.io",
        "v1",
        "tokenreviews",
        "TokenReview",
        False,
        "V1TokenReview",
        verbs=CREATE_ONLY,
    ),
    _builtin(
        "authorization.k8s.io",
        "v1",
        "subjectaccessreviews",
        "SubjectAccessReview",
        False,
        "V1SubjectAccessReview",
        verbs=CREATE_ONLY,
    ),
)

CRDS = ("apiextensions.k8s.io", "customresourcedefinitions")
TOKEN_REVIEWS = ("authentication.k8s.io", "tokenreviews")
ACCESS_REVIEWS = ("authorization.k8s.io", "subjectaccessreviews")


class Registry:
    """Every served resource type, by group-version and plural; CRDs come and go."""

    def __init__(self) -> None:
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        for resource in BUILTINS:
            self.add(resource)

    def add(self, resource: ResourceType) -> None:
        self._types[(resource.group, resource.version, resource.plural)] = resource

    def remove_storage(self, storage: tuple[str, str]) -> None:
        for key in [k for k, r in self._types.items() if r.storage == storage]:
            del self._types[key]

    def get(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._types.get((group, version, plural))

    def of_kind(self, api_version: str, kind: str) -> ResourceType | None:
        for resource in self._types.values():
            if resource.group_version == api_version and resource.kind == kind:
                return resource
        return None

    def any_version(self, storage: tuple[str, str]) -> ResourceType | None:
        for resource in self._types.values():
            if resource.storage == storage:
                return resource
        return None

    def group_versions(self) -> dict[str, list[str]]:
        """Group -> served versions, groups in a stable order (the core group first)."""
        out: dict[str, list[str]] = {}
        for group, version, _ in sorted(self._types):
            versions = out.setdefault(group, [])
            if version not in versions:
                versions.append(version)
        return out

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        return [r for (g, v, _), r in sorted(self._types.items()) if (g, v) == (group, version)]

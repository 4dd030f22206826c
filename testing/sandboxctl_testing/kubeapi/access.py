"""Who a request is (static bearer tokens) and what it may do (RBAC over the stored
Roles, ClusterRoles and their bindings), for requests, TokenReviews and
SubjectAccessReviews alike.

A request without credentials is ``system:admin`` in ``system:masters`` (the plain
kubeconfig every test uses); one with an unknown token is 401. Tokens come from a file in
kube-apiserver's ``--token-auth-file`` format: ``token,user,uid,"group1,group2"``.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"
ADMIN_USER = "system:admin"


@dataclass(frozen=True, slots=True)
class User:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"username": self.name, "groups": list(self.groups)}
        if self.uid:
            out["uid"] = self.uid
        return out


ADMIN = User(ADMIN_USER, groups=(MASTERS, AUTHENTICATED))


@dataclass(frozen=True, slots=True)
class Attributes:
    """What a request does, as SubjectAccessReview's resourceAttributes name it."""

    verb: str
    group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""  # a non-resource URL

    @property
    def is_resource(self) -> bool:
        return not self.path


def load_tokens(path: Path | None) -> dict[str, User]:
    if path is None:
        return {}
    users = {}
    for row in csv.reader(io.StringIO(path.read_text(encoding="utf-8"))):
        if not row or row[0].startswith("#"):
            continue
        if len(row) < 2:
            raise ValueError(f"{path}: a token line needs at least token,user")
        groups = tuple(g for g in (row[3].split(",") if len(row) > 3 else []) if g)
        users[row[0].strip()] = User(
            row[1].strip(), row[2].strip() if len(row) > 2 else "", (*groups, AUTHENTICATED)
        )
    return users


def service_account_user(namespace: str, name: str) -> User:
    return User(
        f"system:serviceaccount:{namespace}:{name}",
        groups=("system:serviceaccounts", f"system:serviceaccounts:{namespace}", AUTHENTICATED),
    )


class Authorizer:
    """RBAC as kube-apiserver evaluates it; ``objects(kind)`` lists the stored RBAC
    objects of one plural (roles, clusterroles, rolebindings, clusterrolebindings)."""

    def __init__(self, objects: Callable[[str], Iterable[dict[str, Any]]]) -> None:
        self._objects = objects

    def allowed(self, user: User, attrs: Attributes) -> bool:
        if MASTERS in user.groups:
            return True
        for binding in self._objects("clusterrolebindings"):
            if _binds(binding, user) and self._role_allows(binding, "", attrs):
                return True
        if attrs.namespace:
            for binding in self._objects("rolebindings"):
                meta = binding.get("metadata") or {}
                if (
                    meta.get("namespace") == attrs.namespace
                    and _binds(binding, user)
                    and self._role_allows(binding, attrs.namespace, attrs)
                ):
                    return True
        return False

    def _role_allows(self, binding: dict[str, Any], namespace: str, attrs: Attributes) -> bool:
        ref = binding.get("roleRef") or {}
        plural = "clusterroles" if ref.get("kind") == "ClusterRole" else "roles"
        for role in self._objects(plural):
            meta = role.get("metadata") or {}
            if meta.get("name") != ref.get("name"):
                continue
            if plural == "roles" and meta.get("namespace") != namespace:
                continue
            if any(_rule_allows(rule, attrs) for rule in role.get("rules") or []):
                return True
        return False


def _binds(binding: dict[str, Any], user: User) -> bool:
    for subject in binding.get("subjects") or []:
        kind = subject.get("kind")
        name = subject.get("name")
        if kind == "User" and name == user.name:
            return True
        if kind == "Group" and name in user.groups:
            return True
        if kind == "ServiceAccount":
            namespace = subject.get("namespace") or (binding.get("metadata") or {}).get("namespace")
            if user.name == f"system:serviceaccount:{namespace}:{name}":
                return True
    return False


def _rule_allows(rule: dict[str, Any], attrs: Attributes) -> bool:
    verbs = rule.get("verbs") or []
    if "*" not in verbs and attrs.verb not in verbs:
        return False
    if not attrs.is_resource:
        return _url_allowed(rule.get("nonResourceURLs") or [], attrs.path)
    groups = rule.get("apiGroups") or []
    if "*" not in groups and attrs.group not in groups:
        return False
    if not _resource_allowed(rule.get("resources") or [], attrs):
        return False
    names = rule.get("resourceNames") or []
    return not names or attrs.name in names


def _url_allowed(urls: list[str], path: str) -> bool:
    """A non-resource path: named, or under a ``prefix*``, or ``*``."""
    return any(u == "*" or u == path or (u.endswith("*") and path.startswith(u[:-1])) for u in urls)


def _resource_allowed(resources: list[str], attrs: Attributes) -> bool:
    """``*``, the resource (``pods``, ``pods/status``) or ``*/subresource``."""
    resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    return any(
        r in ("*", resource) or (r.startswith("*/") and attrs.subresource == r[2:])
        for r in resources
    )


def review(authorizer: Authorizer, spec: Mapping[str, Any]) -> dict[str, Any]:
    """A SubjectAccessReview's status for its spec."""
    user = User(
        str(spec.get("user") or ""),
        str(spec.get("uid") or ""),
        tuple(spec.get("groups") or ()),
    )
    resource = spec.get("resourceAttributes")
    other = spec.get("nonResourceAttributes")
    if isinstance(resource, dict):
        attrs = Attributes(
            verb=str(resource.get("verb") or ""),
            group=str(resource.get("group") or ""),
            resource=str(resource.get("resource") or ""),
            subresource=str(resource.get("subresource") or ""),
            namespace=str(resource.get("namespace") or ""),
            name=str(resource.get("name") or ""),
        )
    elif isinstance(other, dict):
        attrs = Attributes(verb=str(other.get("verb") or ""), path=str(other.get("path") or "/"))
    else:
        return {
            "allowed": False,
            "evaluationError": "spec needs resourceAttributes or nonResourceAttributes",
        }
    if authorizer.allowed(user, attrs):
        return {"allowed": True, "reason": "RBAC: allowed by a binding"}
    return {"allowed": False, "reason": f"RBAC: {user.name!r} may not {attrs.verb} that"}

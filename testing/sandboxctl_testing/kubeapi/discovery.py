"""What kubectl and the official client read before they touch a resource: version,
legacy discovery, a minimal OpenAPI v3, and Table answers."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sandboxctl.core.timestamps import parse_rfc3339
from sandboxctl_testing.kubeapi.resources import Registry, ResourceType

GIT_VERSION = "v1.35.2-sandboxctl-double"


def version_info() -> dict[str, str]:
    return {
        "major": "1",
        "minor": "35",
        "gitVersion": GIT_VERSION,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def api_versions() -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
    }


def group_list(registry: Registry) -> dict[str, Any]:
    groups = [_group(g, v) for g, v in registry.group_versions().items() if g]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def group(registry: Registry, name: str) -> dict[str, Any] | None:
    versions = registry.group_versions().get(name)
    if not versions or not name:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name, versions)}


def _group(name: str, versions: list[str]) -> dict[str, Any]:
    listed = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": listed, "preferredVersion": listed[0]}


def resource_list(registry: Registry, group_name: str, version: str) -> dict[str, Any] | None:
    resources = registry.in_group_version(group_name, version)
    if not resources:
        return None
    items: list[dict[str, Any]] = []
    for r in resources:
        items.append(
            {
                "name": r.plural,
                "singularName": r.singular,
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": list(r.verbs),
                **({"shortNames": list(r.short_names)} if r.short_names else {}),
            }
        )
        if r.status:
            items.append(
                {
                    "name": f"{r.plural}/status",
                    "singularName": "",
                    "namespaced": r.namespaced,
                    "kind": r.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
    group_version = f"{group_name}/{version}" if group_name else version
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": items,
    }


def openapi_root(registry: Registry) -> dict[str, Any]:
    paths = {}
    for name, versions in registry.group_versions().items():
        for version in versions:
            key = f"apis/{name}/{version}" if name else f"api/{version}"
            paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash=0"}
    return {"paths": paths}


def openapi_group_version(
    registry: Registry, group_name: str, version: str
) -> dict[str, Any] | None:
    """Enough for kubectl to leave validation to the server (``fieldValidation=Strict``)."""
    resources = registry.in_group_version(group_name, version)
    if not resources:
        return None
    prefix = f"/apis/{group_name}/{version}" if group_name else f"/api/{version}"
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for r in resources:
        schema_name = f"{group_name or 'core'}.{version}.{r.kind}"
        item = (
            f"{prefix}/namespaces/{{namespace}}/{r.plural}/{{name}}"
            if r.namespaced
            else f"{prefix}/{r.plural}/{{name}}"
        )
        gvk = {"group": group_name, "version": version, "kind": r.kind}
        paths[item] = {
            "patch": {
                "x-kubernetes-group-version-kind": gvk,
                "parameters": [
                    {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}
                ],
                "responses": {
                    "200": {
                        "content": {
                            "application/json": {
                                "schema": {"$ref": f"#/components/schemas/{schema_name}"}
                            }
                        }
                    }
                },
            }
        }
        schemas[schema_name] = {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "x-kubernetes-group-version-kind": [gvk],
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.35.2"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


# --- Table ----------------------------------------------------------------------------------


def table(
    resource: ResourceType, objects: list[dict[str, Any]], now: datetime, rv: str | None
) -> dict[str, Any]:
    columns = [
        {"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0}
    ]
    columns += [
        {
            "name": c.name,
            "type": c.type,
            "format": c.format,
            "description": c.description,
            "priority": c.priority,
        }
        for c in resource.columns
    ]
    if not resource.columns:  # as kube-apiserver: a CRD that lists columns lists Age itself
        columns.append(
            {"name": "Age", "type": "date", "format": "", "description": "Age", "priority": 0}
        )
    rows = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        cells: list[Any] = [meta.get("name", "")]
        cells += [_cell(_json_path(obj, c.path), c.type, now) for c in resource.columns]
        if not resource.columns:
            cells.append(_age(meta.get("creationTimestamp"), now))
        rows.append(
            {
                "cells": cells,
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": meta,
                },
            }
        )
    metadata = {"resourceVersion": rv} if rv is not None else {}
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": columns,
        "rows": rows,
    }


def wants_table(accept: str) -> bool:
    return "as=Table" in accept and "g=meta.k8s.io" in accept


def _json_path(obj: Any, path: str) -> Any:
    node = obj
    for part in path.strip().lstrip(".").replace("[", ".[").split("."):
        if not part:
            continue
        if part.startswith("[") and part.endswith("]"):
            index = part[1:-1]
            if not isinstance(node, list) or not index.isdigit() or int(index) >= len(node):
                return None
            node = node[int(index)]
        elif isinstance(node, dict):
            node = node.get(part)
        else:
            return None
    return node


def _cell(value: Any, kind: str, now: datetime) -> Any:
    if value is None:
        return None
    if kind == "date" and isinstance(value, str):
        try:
            return _age(value, now)
        except ValueError:
            return value
    if isinstance(value, (list, dict)):
        return str(value)
    return value


def _age(stamp: str | None, now: datetime) -> str:
    if not stamp:
        return "<unknown>"
    seconds = int((now - parse_rfc3339(stamp)).total_seconds())
    if seconds < 120:
        return f"{max(seconds, 0)}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 48 * 3600:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"

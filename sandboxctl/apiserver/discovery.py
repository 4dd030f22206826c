"""Discovery documents: what kubectl reads before any request for a resource.

Legacy discovery only (``APIVersions``, ``APIGroupList``, ``APIGroup``,
``APIResourceList``), as plain ``application/json``: kubectl 1.35 asks for aggregated
discovery first and falls back to these when it gets them.
"""

from __future__ import annotations

import platform
import sys
from typing import Any, Final

from sandboxctl import __version__
from sandboxctl.core.names import SANDBOXES

API_VERSION: Final = SANDBOXES.api_version
GROUP, VERSION, KIND, PLURAL = SANDBOXES.group, SANDBOXES.version, SANDBOXES.kind, SANDBOXES.plural
VERBS: Final = ("create", "delete", "get", "list", "watch")
OPENAPI_V3_GROUP: Final = f"/openapi/v3/apis/{API_VERSION}"

KUBE_MAJOR: Final = "1"
KUBE_MINOR: Final = "35"  # within one minor of the pinned kubectl, so it prints no skew warning

_MACHINES: Final = {"x86_64": "amd64", "aarch64": "arm64"}


def version_info() -> dict[str, str]:
    """``GET /version``: every field of ``version.Info`` (the v37 client needs all nine).

    It is not an object, so it has no ``kind``, exactly like a real API server's."""
    machine = platform.machine().lower()
    return {
        "major": KUBE_MAJOR,
        "minor": KUBE_MINOR,
        "gitVersion": f"v{KUBE_MAJOR}.{KUBE_MINOR}.0-sandboxctl.{__version__}",
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
        "goVersion": f"python{sys.version_info.major}.{sys.version_info.minor}",
        "compiler": "cpython",
        "platform": f"linux/{_MACHINES.get(machine, machine)}",
    }


def api_versions() -> dict[str, Any]:
    """``GET /api``: no version, because the core group serves nothing here.

    Naming ``v1`` with an empty ``/api/v1`` makes kubectl's discovery fail with
    "received empty response for: v1" (``kubectl api-resources`` exits 1)."""
    return {
        "kind": "APIVersions",
        "apiVersion": "v1",
        "versions": [],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
    }


def core_resources() -> dict[str, Any]:
    """``GET /api/v1``: an empty resource list, for clients that ask without discovery."""
    return resource_list("v1", [])


def api_group() -> dict[str, Any]:
    """``GET /apis/agents.x-k8s.io``."""
    version = {"groupVersion": API_VERSION, "version": VERSION}
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": GROUP,
        "versions": [version],
        "preferredVersion": version,
    }


def api_group_list() -> dict[str, Any]:
    """``GET /apis``."""
    group = api_group()
    del group["kind"], group["apiVersion"]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]}


def sandbox_resources() -> dict[str, Any]:
    """``GET /apis/agents.x-k8s.io/v1beta1``: the one resource, sandboxes."""
    sandboxes = {
        "name": PLURAL,
        "singularName": SANDBOXES.singular,
        "namespaced": SANDBOXES.namespaced,
        "kind": KIND,
        "verbs": list(VERBS),
        "shortNames": list(SANDBOXES.short_names),
    }
    return resource_list(API_VERSION, [sandboxes])


def resource_list(group_version: str, resources: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }


def openapi_v3_root() -> dict[str, Any]:
    """``GET /openapi/v3``: the one group-version document.

    A minimal OpenAPI v3, only so that ``kubectl create -f`` and ``apply`` work without
    ``--validate=false``: kubectl then leaves validation to the server (it sends
    ``fieldValidation=Strict``, which is accepted and ignored). Like ``/version`` it is
    not a Kubernetes object and has no ``kind``."""
    return {"paths": {f"apis/{API_VERSION}": {"serverRelativeURL": f"{OPENAPI_V3_GROUP}?hash=0"}}}


def openapi_v3_group() -> dict[str, Any]:
    """``GET /openapi/v3/apis/agents.x-k8s.io/v1beta1``: what kubectl reads from it.

    kubectl looks for the ``fieldValidation`` parameter on the item's patch operation to
    learn that the server validates; patch itself is still not served (405)."""
    gvk = {"group": GROUP, "version": VERSION, "kind": KIND}
    item = f"/apis/{API_VERSION}/namespaces/{{namespace}}/{PLURAL}/{{name}}"
    schema = f"io.x-k8s.agents.{VERSION}.{KIND}"
    return {
        "openapi": "3.0.0",
        "info": {"title": "sandboxctl", "version": VERSION},
        "paths": {
            item: {
                "patch": {
                    "x-kubernetes-group-version-kind": gvk,
                    "parameters": [
                        {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}
                    ],
                    "responses": {"200": {"description": "OK"}},
                }
            }
        },
        "components": {
            "schemas": {
                schema: {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": True,
                    "x-kubernetes-group-version-kind": [gvk],
                }
            }
        },
    }

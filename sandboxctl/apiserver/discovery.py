"""Discovery documents: what kubectl reads before any request for a resource.

Legacy discovery only (``APIVersions``, ``APIGroupList``, ``APIGroup``,
``APIResourceList``), as plain ``application/json``: kubectl 1.35 asks for aggregated
discovery first and falls back to these when it gets them.
"""

from __future__ import annotations

import hashlib
import json
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

    kubectl reads it for ``create -f`` and ``apply`` (so they work without
    ``--validate=false``: kubectl then leaves validation to the server, sending
    ``fieldValidation=Strict``, which is accepted and ignored) and for ``explain`` (kubectl
    1.35 reads OpenAPI v3 when a server serves it, never v2). Like ``/version`` it is not a
    Kubernetes object and has no ``kind``."""
    digest = hashlib.sha256(json.dumps(openapi_v3_group(), sort_keys=True).encode()).hexdigest()
    url = f"{OPENAPI_V3_GROUP}?hash={digest.upper()}"  # a new schema, a new URL: caches miss
    return {"paths": {f"apis/{API_VERSION}": {"serverRelativeURL": url}}}


def openapi_v3_group() -> dict[str, Any]:
    """``GET /openapi/v3/apis/agents.x-k8s.io/v1beta1``: the Sandbox schema, every field
    described (``kubectl explain sandboxes``, ``kubectl explain sandbox.spec``).

    kubectl looks for the ``fieldValidation`` parameter on the item's patch operation to
    learn that the server validates; patch itself is still not served (405)."""
    gvk = {"group": GROUP, "version": VERSION, "kind": KIND}
    item = f"/apis/{API_VERSION}/namespaces/{{namespace}}/{PLURAL}/{{name}}"
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
        "components": {"schemas": {SCHEMA_NAME: sandbox_schema()}},
    }


SCHEMA_NAME: Final = f"io.x-k8s.agents.{VERSION}.{KIND}"
_ANNOTATIONS: Final = "sandbox.cocoonstack.io/"


def _field(kind: str, text: str, **more: Any) -> dict[str, Any]:
    return {"type": kind, "description": text, **more}


def _object(text: str, properties: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"type": "object", "description": text, "properties": properties, **more}


def _strings(text: str) -> dict[str, Any]:
    return _field("object", text, additionalProperties={"type": "string"})


def sandbox_schema() -> dict[str, Any]:
    """The Sandbox as this server reads a create and answers every read."""
    return _object(
        "A sandbox claimed on one node of the fleet. It is never stored: every read is made "
        "from the nodes' inventories, so a read shows metadata and status, never spec. A "
        "create claims a sandbox (a warm one when a node has it); a delete releases it.",
        {
            "apiVersion": _field("string", f"The versioned schema of this object: {API_VERSION}."),
            "kind": _field("string", f"The kind of this object: {KIND}."),
            "metadata": _metadata_schema(),
            "spec": _spec_schema(),
            "status": _status_schema(),
        },
        **{
            "x-kubernetes-preserve-unknown-fields": True,
            "x-kubernetes-group-version-kind": [{"group": GROUP, "version": VERSION, "kind": KIND}],
        },
    )


def _metadata_schema() -> dict[str, Any]:
    return _object(
        "The object's name, namespace, labels and annotations.",
        {
            "name": _field(
                "string",
                "The sandbox's name in its namespace (an RFC 1123 subdomain). A sandbox the "
                "e2b API created is named e2b-...; get and delete find a sandbox by its id "
                "(the SDK's sb-...) too.",
            ),
            "generateName": _field(
                "string", "A prefix the server completes with five random characters."
            ),
            "namespace": _field("string", "The namespace (an e2b API key drives one)."),
            "labels": _strings(
                f"Set by the server: {_ANNOTATIONS}node, phase, template and claim; "
                "selectable with -l."
            ),
            "annotations": _strings(
                f"Read on create: {_ANNOTATIONS}ttl-seconds (the lease, in seconds) and "
                f"{_ANNOTATIONS}net (none or egress). Shown on reads: {_ANNOTATIONS}claim-id "
                "(the sandbox's id as the e2b SDK spells it, sb-...), deadline, metadata, "
                "cpu-count and memory-bytes."
            ),
            "creationTimestamp": _field(
                "string", "When the sandbox was claimed.", format="date-time"
            ),
            "resourceVersion": _field(
                "string", "This server's version of the object; watches resume from it."
            ),
        },
    )


def _spec_schema() -> dict[str, Any]:
    container = _object(
        "A container.",
        {
            "name": _field("string", "Any name; not read."),
            "image": _field(
                "string",
                "The template to claim from, named as the e2b API's templateID names it: an "
                "alias (base and code-interpreter-v1 name the fleet's template), else a "
                "template a fresh node serves.",
            ),
            "resources": _object(
                "The sandbox's size: requests (else limits) above 4 CPU or 8Gi are large, "
                "above 1 CPU or 2Gi medium, else small; with neither, the alias's size.",
                {
                    "requests": _strings("cpu and memory, as Kubernetes quantities."),
                    "limits": _strings("cpu and memory, read when there are no requests."),
                },
            ),
        },
    )
    pod_spec = _object(
        "The pod the sandbox stands for.",
        {"containers": _field("array", "The containers: only the first is read.", items=container)},
        **{"x-kubernetes-preserve-unknown-fields": True},
    )
    pod_metadata = _object(
        "The pod template's metadata: its annotations as the object's.",
        {"annotations": _strings(f"{_ANNOTATIONS}net, when the object does not set it.")},
        **{"x-kubernetes-preserve-unknown-fields": True},
    )
    return _object(
        "What a create asks for. Read once, at the create, and never shown by a read.",
        {
            "podTemplate": _object(
                "The template and size to claim, as a pod template.",
                {"metadata": pod_metadata, "spec": pod_spec},
            ),
            "shutdownTime": _field(
                "string",
                "When the sandbox's lease ends (wins over the ttl-seconds annotation); it "
                "must be in the future.",
                format="date-time",
            ),
        },
    )


def _status_schema() -> dict[str, Any]:
    condition = _object(
        "A condition: Ready, True while the node reports the sandbox Running.",
        {
            "type": _field("string", "Ready."),
            "status": _field("string", "True, or False."),
            "reason": _field("string", "The phase the node reports."),
            "message": _field("string", "Which node reported it."),
        },
    )
    address = _object("An address.", {"ip": _field("string", "The sandbox's address.")})
    return _object(
        "Where the sandbox runs and how it is, as its node's inventory reports it.",
        {
            "nodeName": _field("string", "The node that holds the sandbox."),
            "podIPs": _field("array", "The sandbox's address on its node.", items=address),
            "conditions": _field("array", "The sandbox's Ready condition.", items=condition),
        },
    )

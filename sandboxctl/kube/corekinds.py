"""Calls on the core ``v1`` kinds sandboxctl reads and writes: pods and nodes.

``CoreObjects`` gives them the list and watch calls of :class:`CustomObjects` (raw JSON,
no model classes: the guard's tick reads thousands of pods), so the shared ``Informer``
caches them. ``Pods`` holds the only pod writes: a merge patch of one pod's metadata, and
the GET that re-reads a pod after a refused write.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from kubernetes import client

from sandboxctl.core.names import Resource
from sandboxctl.kube.errors import call, mapped
from sandboxctl.kube.resources import MERGE_PATCH, REQUEST_TIMEOUT, CustomObjects

PODS = Resource("", "v1", "pods", "Pod", namespaced=True)
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)


def _json(response: Any) -> dict[str, Any]:
    """The body of a call made with ``_preload_content=False``: the JSON as sent, without
    the client's model classes."""
    body: dict[str, Any] = json.loads(response.data)
    return body


class CoreObjects(CustomObjects):
    """List and watch of a core ``v1`` kind (pods, nodes): ``CustomObjects``' own calls,
    on the core API."""

    def __init__(
        self, api: client.ApiClient, resource: Resource, timeout: float = REQUEST_TIMEOUT
    ) -> None:
        if resource.group or resource.plural not in ("pods", "nodes"):
            raise ValueError(f"CoreObjects serves pods and nodes, not {resource.qualified}")
        super().__init__(api, resource, timeout)
        self._core = client.CoreV1Api(api)

    def _where(self, verb: str, name: str = "") -> str:
        return f"{verb} {self.resource.plural}{'/' + name if name else ''}"

    def _list_call(self, namespace: str | None, **options: Any) -> Any:
        """What ``CustomObjects.list`` and ``watch`` call: a list answers the JSON (no
        model classes), a watch (``_preload_content=False``) the raw response."""
        raw = options.get("_preload_content") is False
        options["_preload_content"] = False
        response: Any
        if self.resource.plural == "nodes":
            response = self._core.list_node(**options)
        elif namespace is None:
            response = self._core.list_pod_for_all_namespaces(**options)
        else:
            response = self._core.list_namespaced_pod(namespace, **options)
        return response if raw else _json(response)


class PodCalls(Protocol):
    """The pod calls outside the informer (``Pods``, or a test's stand-in)."""

    def get(self, namespace: str, name: str, timeout: float) -> dict[str, Any]: ...

    def patch(
        self, namespace: str, name: str, body: dict[str, Any], timeout: float
    ) -> dict[str, Any]: ...


class Pods:
    """The pod calls outside the informer: GET and merge PATCH, each with a timeout."""

    def __init__(self, api: client.ApiClient) -> None:
        self._core = client.CoreV1Api(api)

    def get(self, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        return call(
            f"get pods/{name}",
            lambda: _json(
                self._core.read_namespaced_pod(
                    name, namespace, _preload_content=False, _request_timeout=timeout
                )
            ),
        )

    def patch(
        self, namespace: str, name: str, body: dict[str, Any], timeout: float
    ) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386: ``null`` deletes a key), asked for explicitly: the
        client would otherwise send a strategic merge patch for a pod."""
        with mapped(f"patch pods/{name}"):
            return _json(
                self._core.patch_namespaced_pod(
                    name,
                    namespace,
                    body,
                    _content_type=MERGE_PATCH,
                    _preload_content=False,
                    _request_timeout=timeout,
                )
            )

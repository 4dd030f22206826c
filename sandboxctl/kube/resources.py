"""The calls made on the custom resources sandboxctl reads and writes (their names are
``core.names``'s).

Objects stay plain dicts (the JSON the server sent), read by ``core.model`` straight
from them; only a watch may read a resource's events typed (``decode_event``), as the kube
inventory source reads a NodeInventory's entries.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from sandboxctl.core.names import (
    Resource,
)
from sandboxctl.kube.errors import call, kube_error, mapped

APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
REQUEST_TIMEOUT = 10.0  # seconds; a hung server fails the call instead of the caller


@dataclass(frozen=True, slots=True)
class Listed:
    items: list[dict[str, Any]]
    resource_version: str


def has_condition(obj: dict[str, Any], kind: str) -> bool:
    """Whether ``obj``'s status condition ``kind`` is True (a null or absent list: no)."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(
        isinstance(c, dict) and c.get("type") == kind and c.get("status") == "True"
        for c in conditions
    )


def watch_lines(segments: Iterable[bytes]) -> Iterator[bytes]:
    """The lines of a watch response's body as its segments arrive. Only the bytes that
    came since the last line are searched (the client's ``iter_resp_lines`` searches its
    whole buffer on every segment, and decodes each line to text first)."""
    pending = bytearray()
    for segment in segments:
        end = segment.find(b"\n")
        if end == -1:
            pending += segment
            continue
        pending += segment[:end]
        yield bytes(pending)
        pending = bytearray()
        start = end + 1
        while (end := segment.find(b"\n", start)) != -1:
            yield segment[start:end]
            start = end + 1
        pending += segment[start:]
    # What is left never ended with a newline: a cut stream, whose event is sent again.


_decoder = msgspec.json.Decoder()

DecodeEvent = Callable[[bytes], dict[str, Any]]


def read_json(data: bytes) -> Any:
    """JSON as the client reads it. msgspec reads a 2000-entry NodeInventory in half the
    time of ``json``; what it refuses and ``json`` reads (invalid UTF-8, replaced as the
    client does; a number beyond a double's range) goes to ``json``."""
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError:
        return json.loads(data.decode("utf-8", errors="replace"))


def watch_event(line: bytes) -> dict[str, Any]:
    """One watch event parsed."""
    event = read_json(line)
    if not isinstance(event, dict):
        raise ValueError(f"a watch event must be a JSON object, not {type(event).__name__}")
    return event


class WatchStream:
    """The events of one watch response, each parsed once from its bytes (the client's
    ``Watch`` parses every object twice, which a 2000-entry inventory pays for in
    milliseconds)."""

    def __init__(self, response: Any, what: str, decode: DecodeEvent = watch_event) -> None:
        self._response = response
        self._what = what
        self._decode = decode

    def __iter__(self) -> Iterator[dict[str, Any]]:
        try:
            for line in watch_lines(self._response.stream(amt=None, decode_content=False)):
                if not line:
                    continue
                event = self._decode(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    failure = ApiException(status=status.get("code"), reason=status.get("reason"))
                    failure.body = json.dumps(status)
                    raise kube_error(failure, self._what) from None
                yield event
        except (HTTPError, OSError, ValueError) as error:
            raise kube_error(error, self._what) from error
        finally:
            self._response.release_conn()

    def stop(self) -> None:
        """End the stream from another thread: its reader sees the end, or an error."""
        connection = getattr(self._response, "connection", None)
        sock = getattr(connection, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class CustomObjects:
    """Calls on one custom resource; every failure is a :class:`KubeError`."""

    def __init__(
        self,
        api: client.ApiClient,
        resource: Resource,
        timeout: float = REQUEST_TIMEOUT,
        decode_event: DecodeEvent = watch_event,
    ) -> None:
        """``decode_event`` reads each watch line; a resource with a shape of its own
        may read it typed (it must answer what :func:`watch_event` would, ERROR
        events included)."""
        self.resource = resource
        self._api = client.CustomObjectsApi(api)
        self._timeout = timeout
        self.decode_event = decode_event

    def _where(self, verb: str, name: str = "") -> str:
        target = f"{self.resource.qualified}/{name}" if name else self.resource.qualified
        return f"{verb} {target}"

    def _list_call(self, namespace: str | None, **options: Any) -> Any:
        r = self.resource
        if namespace is None:
            return self._api.list_cluster_custom_object(r.group, r.version, r.plural, **options)
        return self._api.list_namespaced_custom_object(
            r.group, r.version, namespace, r.plural, **options
        )

    def list(
        self, namespace: str | None = None, label_selector: str = "", field_selector: str = ""
    ) -> Listed:
        """Every object (in ``namespace``, or everywhere), and the list's version."""
        answer: dict[str, Any] = call(
            self._where("list"),
            lambda: self._list_call(
                namespace,
                label_selector=label_selector or None,
                field_selector=field_selector or None,
                _request_timeout=self._timeout,
            ),
        )
        version = str((answer.get("metadata") or {}).get("resourceVersion") or "")
        return Listed(list(answer.get("items") or []), version)

    def watch(
        self,
        resource_version: str,
        timeout_seconds: int,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> WatchStream:
        """A watch from ``resource_version`` with bookmarks, ended by the server after
        ``timeout_seconds``. Events are the raw JSON (``type``, ``object``); an ERROR event
        (410 included) raises its KubeError. ``stop()`` from another thread ends it."""
        response = call(
            self._where("watch"),
            lambda: self._list_call(
                namespace,
                watch=True,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout_seconds,
                label_selector=label_selector or None,
                field_selector=field_selector or None,
                _preload_content=False,
                _request_timeout=(self._timeout, timeout_seconds + 30),
            ),
        )
        return WatchStream(response, self._where("watch"), self.decode_event)

    def get(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        r = self.resource

        def read() -> Any:
            if namespace is None:
                return self._api.get_cluster_custom_object(
                    r.group, r.version, r.plural, name, _request_timeout=self._timeout
                )
            return self._api.get_namespaced_custom_object(
                r.group, r.version, namespace, r.plural, name, _request_timeout=self._timeout
            )

        found: dict[str, Any] = call(self._where("get", name), read)
        return found

    def apply(
        self,
        body: dict[str, Any],
        field_manager: str,
        force: bool = True,
        namespace: str | None = None,
    ) -> None:
        """Server-side apply ``body`` (created when absent). Nothing is returned: a create
        answers 201, which the client does not read back."""
        r = self.resource
        name = body["metadata"]["name"]
        with mapped(self._where("apply", name)):
            if namespace is None:
                self._api.patch_cluster_custom_object(
                    r.group,
                    r.version,
                    r.plural,
                    name,
                    body,
                    field_manager=field_manager,
                    force=force,
                    _content_type=APPLY_PATCH,
                    _request_timeout=self._timeout,
                )
            else:
                self._api.patch_namespaced_custom_object(
                    r.group,
                    r.version,
                    namespace,
                    r.plural,
                    name,
                    body,
                    field_manager=field_manager,
                    force=force,
                    _content_type=APPLY_PATCH,
                    _request_timeout=self._timeout,
                )

    def patch_status(
        self, name: str, status: dict[str, Any], namespace: str, resource_version: str = ""
    ) -> None:
        """Merge ``status`` into the status subresource; with ``resource_version`` the
        write is refused (KubeConflict) when the object has moved on."""
        r = self.resource
        metadata = {"resourceVersion": resource_version} if resource_version else {}
        body = {"metadata": metadata, "status": status}
        with mapped(self._where("patch status of", name)):
            self._api.patch_namespaced_custom_object_status(
                r.group,
                r.version,
                namespace,
                r.plural,
                name,
                body,
                _content_type=MERGE_PATCH,
                _request_timeout=self._timeout,
            )

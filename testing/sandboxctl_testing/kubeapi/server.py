"""The double's HTTP surface: routing, authentication and RBAC, Status bodies, Table
answers, chunked watch streams, and the ``/_fake`` test hooks.

Stdlib ``ThreadingHTTPServer`` with HTTP/1.1 keep-alive and TCP_NODELAY (without it every
answer waits on the client's delayed ACK, about 40 ms). The body is read before routing,
so an error never leaves unread bytes on a kept-alive connection.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from sandboxctl_testing.kubeapi import access, discovery
from sandboxctl_testing.kubeapi.patches import APPLY, JSON_PATCH, MERGE, STRATEGIC
from sandboxctl_testing.kubeapi.resources import ACCESS_REVIEWS, CRDS, TOKEN_REVIEWS, ResourceType
from sandboxctl_testing.kubeapi.store import ApiError, Store, Write
from sandboxctl_testing.kubeapi.watch import Watch, WatchRequest

log = logging.getLogger(__name__)

NOT_FOUND_PATH = "the server could not find the requested resource"
DEFAULT_WATCH_SECONDS = 1800
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})


@dataclass
class Fault:
    """``count`` next requests whose method and path match answer ``status``."""

    method: str
    path: str
    status: int
    count: int


@dataclass
class Settings:
    tokens: dict[str, access.User] = field(default_factory=dict)
    bookmark_seconds: float = 1.0
    request_log: Path | None = None


class KubeApiServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], store: Store, settings: Settings) -> None:
        super().__init__(address, Handler)
        self.store = store
        self.settings = settings
        self.authorizer = access.Authorizer(
            lambda plural: store.all(("rbac.authorization.k8s.io", plural))
        )
        self.faults: list[Fault] = []
        self.log_lock = threading.Lock()
        self.open_streams: set[socket.socket] = set()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host if isinstance(host, str) else host.decode()}:{port}"


@dataclass(frozen=True)
class Route:
    resource: ResourceType
    namespace: str
    name: str
    subresource: str

    @property
    def where(self) -> tuple[ResourceType, str, str]:
        """The store's address of the object: resource, namespace, name."""
        return self.resource, self.namespace, self.name


@dataclass(frozen=True)
class _Call:
    """One authorized request on a resource, with what every write reads of its query."""

    route: Route
    user: access.User
    dry_run: bool
    strict: bool
    manager: str  # fieldManager, else the client's name from its User-Agent


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: KubeApiServer

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # --- the request ----------------------------------------------------------------------

    def _handle(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length) if length else b""
        parts = urlsplit(self.path)
        self.query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        self.path_only = parts.path.rstrip("/") or "/"
        self._log_request(method, parts.query)
        try:
            fault = self._fault(method)
            if fault is not None:
                raise ApiError(
                    fault.status,
                    "InternalError" if fault.status >= 500 else "TooManyRequests",
                    f"injected fault: {fault.status}",
                )
            user = self._user()
            self._route(method, user)
        except ApiError as error:
            self._status(error)
        except (ConnectionResetError, BrokenPipeError):
            self.close_connection = True
        except Exception as error:
            log.exception("kubeapi double: unexpected error")
            causes = [{"message": line} for line in traceback.format_exc().splitlines()[-8:]]
            self._status(
                ApiError(
                    500, "InternalError", f"{type(error).__name__}: {error}", {"causes": causes}
                )
            )

    def _fault(self, method: str) -> Fault | None:
        with self.server.store.lock:
            for fault in self.server.faults:
                if (
                    fault.count > 0
                    and fault.method in ("", method)
                    and fault.path in self.path_only
                ):
                    fault.count -= 1
                    return fault
        return None

    def _user(self) -> access.User:
        header = self.headers.get("Authorization", "")
        if not header:
            return access.ADMIN
        scheme, _, token = header.partition(" ")
        user = (
            self.server.settings.tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        )
        if user is None:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return user

    def _route(self, method: str, user: access.User) -> None:
        path = self.path_only
        segments = [s for s in path.split("/") if s]
        if path.startswith("/_fake/"):
            self._hook(method, segments[1:])
            return
        if method == "GET" and path in ("/healthz", "/readyz", "/livez"):
            self._send(200, b"ok", "text/plain")
            return
        if (
            method == "GET" and path in ("/version", "/api", "/apis", "/openapi/v3")
        ) or path.startswith("/openapi/v3/"):
            self._authorize(user, access.Attributes(verb="get", path=path))
            self._discovery(path, segments)
            return
        if method == "GET" and self._group_discovery(segments):
            return
        group, version, rest = _api_path(segments)
        self._resource(method, self._resource_route(group, version, rest), user)

    def _group_discovery(self, segments: list[str]) -> bool:
        """``/api/VERSION``, ``/apis/GROUP`` and ``/apis/GROUP/VERSION``: whether this was
        one of them (answered, or 404 for one the registry does not serve)."""
        registry = self.server.store.registry
        if segments[:1] == ["api"] and len(segments) == 2:
            doc = discovery.resource_list(registry, "", segments[1])
        elif segments[:1] == ["apis"] and len(segments) == 2:
            doc = discovery.group(registry, segments[1])
        elif segments[:1] == ["apis"] and len(segments) == 3:
            doc = discovery.resource_list(registry, segments[1], segments[2])
        else:
            return False
        self._json(200, doc or _missing())
        return True

    def _resource_route(self, group: str, version: str, rest: list[str]) -> Route:
        registry = self.server.store.registry
        namespace = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            candidate = registry.get(group, version, rest[2])
            if candidate is not None and candidate.namespaced:
                namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise ApiError(404, "NotFound", NOT_FOUND_PATH)
        resource = registry.get(group, version, rest[0])
        if resource is None or (resource.namespaced and len(rest) > 1 and not namespace):
            raise ApiError(404, "NotFound", NOT_FOUND_PATH)
        subresource = rest[2] if len(rest) == 3 else ""
        if subresource and (subresource != "status" or not resource.status):
            raise ApiError(404, "NotFound", NOT_FOUND_PATH)
        return Route(resource, namespace, rest[1] if len(rest) > 1 else "", subresource)

    # --- resources ------------------------------------------------------------------------

    def _resource(self, method: str, route: Route, user: access.User) -> None:
        resource = route.resource
        watching = method == "GET" and not route.name and self.query.get("watch") in _TRUE
        verb = _verb(method, bool(route.name), watching)
        if verb not in resource.verbs:
            raise ApiError(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )
        self._authorize(
            user,
            access.Attributes(
                verb,
                resource.group,
                resource.plural,
                route.subresource,
                route.namespace,
                route.name,
            ),
            resource,
        )
        call = _Call(
            route,
            user,
            dry_run=self.query.get("dryRun") == "All",
            strict=self.query.get("fieldValidation") == "Strict",
            manager=(
                self.query.get("fieldManager")
                or self.headers.get("User-Agent", "unknown").split("/")[0]
            ),
        )
        verbs: dict[str, Callable[[_Call], None]] = {
            "get": self._get,
            "list": self._list,
            "watch": self._watch,
            "create": self._create,
            "update": self._update,
            "patch": self._patch,
            "delete": self._delete,
            "deletecollection": self._delete_collection,
        }
        verbs[verb](call)

    def _get(self, call: _Call) -> None:
        route = call.route
        self._object(200, route.resource, self.server.store.get(*route.where))

    def _list(self, call: _Call) -> None:
        resource = call.route.resource
        items, rv = self._selected(call)
        if discovery.wants_table(self.headers.get("Accept", "")):
            self._json(200, discovery.table(resource, items, _now(), str(rv)))
            return
        self._json(200, _list_body(resource, items, {"resourceVersion": str(rv)}))

    def _create(self, call: _Call) -> None:
        route, store = call.route, self.server.store
        body = self._body()
        if route.resource.storage in (TOKEN_REVIEWS, ACCESS_REVIEWS):
            self._review(route.resource, body)
            return
        written = store.create(
            route.resource,
            route.namespace,
            body,
            manager=call.manager,
            dry_run=call.dry_run,
            strict=call.strict,
        )
        self._write(201, route.resource, written)

    def _update(self, call: _Call) -> None:
        route = call.route
        written = self.server.store.update(
            *route.where,
            self._body(),
            manager=call.manager,
            status=route.subresource == "status",
            dry_run=call.dry_run,
            strict=call.strict,
        )
        self._write(200, route.resource, written)

    def _patch(self, call: _Call) -> None:
        route, store = call.route, self.server.store
        resource = route.resource
        kind = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if kind not in (JSON_PATCH, MERGE, STRATEGIC, APPLY):
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types "
                "include: application/json-patch+json, application/merge-patch+json, "
                "application/apply-patch+yaml",
            )
        body = self._body(yaml_ok=kind == APPLY)
        if kind == APPLY and not store.exists(*route.where):
            # An apply that creates needs create as well as patch, as on a real server.
            attrs = access.Attributes(
                "create", resource.group, resource.plural, "", route.namespace, route.name
            )
            self._authorize(call.user, attrs, resource)
        written = store.patch(
            *route.where,
            kind,
            body,
            manager=self.query.get("fieldManager", "") if kind == APPLY else call.manager,
            force=self.query.get("force") in _TRUE,
            status=route.subresource == "status",
            dry_run=call.dry_run,
            strict=call.strict,
        )
        self._write(201 if written.created else 200, resource, written)

    def _delete(self, call: _Call) -> None:
        options = self._body(required=False) or {}
        if not isinstance(options, dict):
            raise ApiError(400, "BadRequest", "the request body must be a DeleteOptions object")
        dry = call.dry_run or "All" in (options.get("dryRun") or [])
        if "gracePeriodSeconds" in self.query:
            options["gracePeriodSeconds"] = int(self.query["gracePeriodSeconds"])
        deleted = self.server.store.delete(*call.route.where, options, dry_run=dry)
        self._object(200, call.route.resource, deleted)

    def _delete_collection(self, call: _Call) -> None:
        resource, store = call.route.resource, self.server.store
        items, _ = self._selected(call)
        for item in items:
            meta = item["metadata"]
            store.delete(resource, meta.get("namespace", ""), meta["name"], dry_run=call.dry_run)
        self._json(200, _list_body(resource, items, {}))

    def _selected(self, call: _Call) -> tuple[list[dict[str, Any]], int]:
        return self.server.store.select(
            call.route.resource,
            call.route.namespace,
            self.query.get("labelSelector", ""),
            self.query.get("fieldSelector", ""),
        )

    def _review(self, resource: ResourceType, body: Any) -> None:
        if not isinstance(body, dict) or not isinstance(body.get("spec"), dict):
            raise ApiError(400, "BadRequest", f"a {resource.kind} needs a spec")
        spec = body["spec"]
        if resource.storage == TOKEN_REVIEWS:
            user = self.server.settings.tokens.get(str(spec.get("token", "")))
            status: dict[str, Any] = (
                {"authenticated": True, "user": user.to_json()}
                if user is not None
                else {"authenticated": False, "error": "invalid bearer token"}
            )
        else:
            status = access.review(self.server.authorizer, spec)
        answer = {
            "apiVersion": resource.group_version,
            "kind": resource.kind,
            "metadata": body.get("metadata") or {},
            "spec": spec,
            "status": status,
        }
        self._json(201, answer)

    def _authorize(
        self, user: access.User, attrs: access.Attributes, resource: ResourceType | None = None
    ) -> None:
        if self.server.authorizer.allowed(user, attrs):
            return
        if resource is None:
            message = f'forbidden: User "{user.name}" cannot {attrs.verb} path "{attrs.path}"'
        else:
            what = f'resource "{attrs.resource}"' + (
                f' subresource "{attrs.subresource}"' if attrs.subresource else ""
            )
            where = (
                f' in the namespace "{attrs.namespace}"'
                if attrs.namespace
                else " at the cluster scope"
            )
            target = f' "{attrs.name}"' if attrs.name else ""
            message = (
                f'{resource.qualified}{target} is forbidden: User "{user.name}" '
                f"cannot {attrs.verb} "
                f'{what} in API group "{attrs.group}"{where}'
            )
        raise ApiError(
            403,
            "Forbidden",
            message,
            {"name": attrs.name, "group": attrs.group, "kind": attrs.resource},
        )

    # --- watch ----------------------------------------------------------------------------

    def _watch(self, call: _Call) -> None:
        store, route = self.server.store, call.route
        labels = self.query.get("labelSelector", "")
        fields = self.query.get("fieldSelector", "")
        matches = store.matcher(route.resource, labels, fields)
        timeout = int(self.query.get("timeoutSeconds") or 0) or DEFAULT_WATCH_SECONDS
        version = self.query.get("resourceVersion", "")
        if version and not version.isdigit():
            raise ApiError(400, "BadRequest", f"invalid resourceVersion {version!r}: not a number")
        request = WatchRequest(
            route.resource,
            route.namespace,
            labels,
            fields,
            matches,
            bookmarks=self.query.get("allowWatchBookmarks") in _TRUE,
            initial_end=self.query.get("sendInitialEvents") in _TRUE,
            as_table=discovery.wants_table(self.headers.get("Accept", "")),
            deadline=time.monotonic() + timeout,
            version=version,
        )
        watch = Watch(store, request, self.server.settings.bookmark_seconds, self._chunk)
        watch.open()
        self._start_stream()
        sock = self.connection
        self.server.open_streams.add(sock)
        try:
            if not watch.run():  # /_fake/drop-watches: cut without a word
                self.close_connection = True
                sock.shutdown(socket.SHUT_RDWR)
        except (ConnectionResetError, BrokenPipeError, OSError):
            self.close_connection = True
        finally:
            self.server.open_streams.discard(sock)
            if not self.close_connection:
                try:
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:
                    self.close_connection = True

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    # --- discovery and hooks --------------------------------------------------------------

    def _discovery(self, path: str, segments: list[str]) -> None:
        registry = self.server.store.registry
        if path == "/version":
            self._json(200, discovery.version_info())
        elif path == "/api":
            self._json(200, discovery.api_versions())
        elif path == "/apis":
            self._json(200, discovery.group_list(registry))
        elif path == "/openapi/v3":
            self._json(200, discovery.openapi_root(registry))
        else:
            rest = segments[2:]
            if rest[:1] == ["api"] and len(rest) == 2:
                doc = discovery.openapi_group_version(registry, "", rest[1])
            elif rest[:1] == ["apis"] and len(rest) == 3:
                doc = discovery.openapi_group_version(registry, rest[1], rest[2])
            else:
                doc = None
            self._json(200, doc or _missing())

    def _hook(self, method: str, action: list[str]) -> None:
        store = self.server.store
        if method != "POST" or len(action) != 1:
            raise ApiError(404, "NotFound", NOT_FOUND_PATH)
        if action[0] == "compact":
            store.compact()
            store.expire_watches()
        elif action[0] == "expire":
            store.expire_watches()
        elif action[0] == "drop-watches":
            store.drop_watches()
        elif action[0] == "fail":
            spec = self._body()
            with store.lock:
                self.server.faults.append(
                    Fault(
                        spec.get("method", ""),
                        spec.get("path", ""),
                        int(spec.get("status", 500)),
                        int(spec.get("count", 1)),
                    )
                )
        elif action[0] == "flush":
            store.flush()
        else:
            raise ApiError(404, "NotFound", NOT_FOUND_PATH)
        self._json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})

    # --- answers --------------------------------------------------------------------------

    def _body(self, required: bool = True, yaml_ok: bool = False) -> Any:
        if not self.body:
            if required:
                raise ApiError(400, "BadRequest", "the request needs a body")
            return None
        try:
            return json.loads(self.body)
        except ValueError as error:
            if not yaml_ok:
                raise ApiError(400, "BadRequest", f"the body does not parse: {error}") from None
        try:  # an apply body may be YAML; clients send JSON, which json reads far faster
            return yaml.load(self.body, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except yaml.YAMLError as error:
            raise ApiError(400, "BadRequest", f"the body does not parse: {error}") from None

    def _write(self, code: int, resource: ResourceType, written: Write) -> None:
        self._object(code, resource, written.obj, warnings=written.warnings)

    def _object(
        self, code: int, resource: ResourceType, obj: dict[str, Any], warnings: Sequence[str] = ()
    ) -> None:
        if discovery.wants_table(self.headers.get("Accept", "")):
            self._json(code, discovery.table(resource, [obj], _now(), None), warnings)
        else:
            self._json(code, obj, warnings)

    def _status(self, error: ApiError) -> None:
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": error.message,
            "reason": error.reason,
            "code": error.code,
        }
        if error.details:
            body["details"] = error.details
        self._json(error.code, body)

    def _json(self, code: int, body: Any, warnings: Iterable[str] = ()) -> None:
        self._send(
            code, json.dumps(body, separators=(",", ":")).encode(), "application/json", warnings
        )

    def _send(
        self, code: int, data: bytes, content_type: str, warnings: Iterable[str] = ()
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for warning in warnings:
            escaped = warning.replace("\\", "\\\\").replace('"', '\\"')
            self.send_header("Warning", f'299 - "{escaped}"')
        self.end_headers()
        self.wfile.write(data)

    def _log_request(self, method: str, query: str) -> None:
        target = self.server.settings.request_log
        if target is None:
            return
        line = {
            "method": method,
            "path": self.path_only,
            "query": query,
            "accept": self.headers.get("Accept", ""),
            "contentType": self.headers.get("Content-Type", ""),
            "userAgent": self.headers.get("User-Agent", ""),
            "body": self.body[:300].decode("utf-8", "replace"),
        }
        with self.server.log_lock, target.open("a", encoding="utf-8") as stream:
            stream.write(json.dumps(line) + "\n")


def _verb(method: str, named: bool, watching: bool) -> str:
    if method == "GET":
        return "get" if named else ("watch" if watching else "list")
    if method == "POST" and not named:
        return "create"
    if method == "PUT" and named:
        return "update"
    if method == "PATCH" and named:
        return "patch"
    if method == "DELETE":
        return "delete" if named else "deletecollection"
    raise ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
    )


def _api_path(segments: list[str]) -> tuple[str, str, list[str]]:
    """A resource path's group, version and the rest (``/api`` is the core group)."""
    if segments[:1] == ["api"]:
        return "", segments[1] if len(segments) > 1 else "", segments[2:]
    if segments[:1] == ["apis"] and len(segments) >= 2:
        return segments[1], segments[2] if len(segments) > 2 else "", segments[3:]
    raise ApiError(404, "NotFound", NOT_FOUND_PATH)


def _list_body(
    resource: ResourceType, items: list[dict[str, Any]], metadata: dict[str, Any]
) -> dict[str, Any]:
    return {
        "apiVersion": resource.group_version,
        "kind": f"{resource.kind}List",
        "metadata": metadata,
        "items": items,
    }


def _missing() -> Any:
    raise ApiError(404, "NotFound", NOT_FOUND_PATH)


def _now() -> datetime:
    return datetime.now(UTC)


# CRDS is re-exported for the runner, which registers them at start.
__all__ = ["CRDS", "KubeApiServer", "Settings"]

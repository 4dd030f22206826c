"""The Kubernetes-style API for ``sandboxes.agents.x-k8s.io/v1beta1``, over one store.

Enough of the Kubernetes API for kubectl 1.35 and client-go style clients: discovery,
list (namespaced and across namespaces, with label and field selectors), get, watch,
create (a claim) and delete (a release), in JSON or in the Table form ``kubectl get``
prints. Every object and list carries ``apiVersion`` and ``kind``; every error is a
``Status`` (see ``status.py``).

Lists and watches follow Kubernetes (see docs/api.md for the table): a list carries the
store's resourceVersion; a watch from it delivers only later changes, in order; a version
the server no longer holds (or never gave: versions are per server) is 410 Gone, as an
ERROR event on a watch; ``sendInitialEvents``, ``allowWatchBookmarks``, ``timeoutSeconds``,
``limit`` and ``continue`` are honoured.

What differs from a real API server, on purpose:

* Objects are synthesized from inventories and this server's own writes (which it sees at
  once; another replica's, at the node's next publish).
* Delete answers 200 with the last object once the owning node released the claim.
* ``dryRun`` is refused with 400; update and patch are not served (405).

Every request but the health checks needs a bearer token (``auth.py``); bodies over
3 MiB are refused with 413 before they are read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from sandboxctl.agentapi.ids import id_problem
from sandboxctl.apiserver import discovery, tables
from sandboxctl.apiserver.auth import Authenticated, KubeTokens
from sandboxctl.apiserver.creation import SandboxObject, create_request, named, subject_of
from sandboxctl.apiserver.status import NOT_FOUND_PATH, ApiError, api_error
from sandboxctl.apiserver.templatenames import DEFAULT_ALIASES
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.ids import SandboxId
from sandboxctl.core.names import SANDBOXES
from sandboxctl.core.snapshot import Located
from sandboxctl.core.watching import BOOKMARK, WatchEvent
from sandboxctl.core.wire import Model
from sandboxctl.serving.apps import (
    JSON,
    BodyCap,
    answer,
    blocking,
    install_error_handlers,
    json_app,
    read_body,
)
from sandboxctl.serving.metrics import RequestTimes, timed
from sandboxctl.store import Query, SandboxStore
from sandboxctl.store.errors import Expired
from sandboxctl.store.watch import Watch

log = logging.getLogger("sandboxctl.apiserver")

T = TypeVar("T")

GROUP, VERSION, PLURAL = SANDBOXES.group, SANDBOXES.version, SANDBOXES.plural
PREFIX: Final = f"/apis/{SANDBOXES.api_version}"
DEFAULT_WATCH_TIMEOUT: Final = 1800.0  # seconds, when a watch names no timeoutSeconds
BOOKMARK_SECONDS: Final = 30.0  # between the bookmarks of a watch that allows them
MATCHES: Final = frozenset({"", "NotOlderThan", "Exact"})
_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE: Final = frozenset({"0", "f", "F", "FALSE", "false", "False"})
SERVICE: Final = "apiserver"  # its requests' service label (``serving.metrics``)
MAX_BODY_BYTES: Final = 3 << 20  # a Kubernetes API server's default cap
MAX_BODY_DEPTH: Final = 64  # nesting of a body's arrays and objects; deeper is 400


def create_kube_app(
    store: SandboxStore,
    tokens: KubeTokens | None,
    watch_interval: float = 1.0,
    stopping: Callable[[], bool] = lambda: False,
    bookmark_interval: float = BOOKMARK_SECONDS,
    aliases: Mapping[str, tuple[str, str]] = DEFAULT_ALIASES,
    times: RequestTimes | None = None,
    front: Callable[[FastAPI], Any] | None = None,
) -> FastAPI:
    """The API app over ``store``, for the holders of ``tokens``; a create reads its image
    through ``aliases`` as the e2b API reads a ``templateID`` (give both the same). Its
    requests are timed into ``times`` as :data:`SERVICE` when given, around ``front``
    when given (what authenticates outside it: aggregation's requestheader check and
    access review, whose time is the request's too; the app returned is then front's). A
    watch wakes at once for
    an inventory change (the source notifies the store) and for this server's own writes;
    every ``watch_interval`` s it also reads anyway, for what no notification announces:
    a node going stale (a matter of time), and the server stopping.

    Open watches end (cleanly, as at their timeout) once ``stopping()`` is true: uvicorn's
    graceful shutdown waits for every open response, and a watch may run for half an hour.
    """
    if watch_interval <= 0:
        raise ValueError("watch_interval must be positive")
    app = json_app("sandboxctl apiserver")
    watching = _Watching(watch_interval, bookmark_interval, stopping)

    _add_discovery(app)
    _add_sandbox_routes(app, store, watching, aliases)

    install_error_handlers(app, translate=_answer, unmatched=_unmatched)
    app.add_middleware(BodyCap, limit=MAX_BODY_BYTES, refuse=_too_large)
    if tokens is not None:  # None: authenticated outside it (delegated, behind aggregation)
        app.add_middleware(Authenticated, tokens=tokens)  # outermost: before any body is read
    return timed(front(app) if front is not None else app, times, SERVICE)


def _add_discovery(app: FastAPI) -> None:
    """Health (no token needed) and discovery: what kubectl and the clients read first."""

    @app.get("/healthz")
    @app.get("/livez")
    @app.get("/readyz")
    def health() -> Response:
        return Response("ok", media_type="text/plain")

    # --- discovery ---------------------------------------------------------------------

    @app.get("/version")
    @app.get("/version/")
    def version() -> dict[str, str]:
        return discovery.version_info()

    @app.get("/api")
    @app.get("/api/")
    def api() -> dict[str, Any]:
        return discovery.api_versions()

    @app.get("/api/v1")
    def api_v1() -> dict[str, Any]:
        return discovery.core_resources()

    @app.get("/apis")
    @app.get("/apis/")
    def apis() -> dict[str, Any]:
        return discovery.api_group_list()

    @app.get("/apis/{group}")
    def api_group(group: str) -> dict[str, Any]:
        if group != GROUP:
            raise ApiError(404, NOT_FOUND_PATH)
        return discovery.api_group()

    @app.get("/apis/{group}/{version}")
    def api_resources(group: str, version: str) -> dict[str, Any]:
        if (group, version) != (GROUP, VERSION):
            raise ApiError(404, NOT_FOUND_PATH)
        return discovery.sandbox_resources()

    @app.get("/openapi/v3")
    def openapi_v3() -> dict[str, Any]:
        return discovery.openapi_v3_root()

    @app.get(discovery.OPENAPI_V3_GROUP)
    def openapi_v3_group() -> dict[str, Any]:
        return discovery.openapi_v3_group()


def _add_sandbox_routes(
    app: FastAPI,
    store: SandboxStore,
    watching: _Watching,
    aliases: Mapping[str, tuple[str, str]],
) -> None:
    """The Sandbox resource: list and watch, get, create (a claim) and delete. A get or
    delete finds a sandbox by its name, else by its id (the SDK's ``sb-...``, or the
    agents' spelling): ``kubectl get sandbox <sandbox_id>`` finds what the SDK created."""

    @app.get(f"{PREFIX}/{PLURAL}")
    async def list_all(request: Request) -> Response:
        return await _read_collection(store, request, None, watching)

    @app.get(PREFIX + "/namespaces/{namespace}/" + PLURAL)
    async def list_namespaced(request: Request, namespace: str) -> Response:
        return await _read_collection(store, request, namespace, watching)

    @app.get(PREFIX + "/namespaces/{namespace}/" + PLURAL + "/{name}")
    async def get(request: Request, namespace: str, name: str) -> Response:
        located = await _locate(store, namespace, name)
        obj = store.object_of(located)
        if tables.wants_table(request.headers.get("accept", "")):
            return answer(tables.table([obj], store.now()))
        return answer(obj)

    @app.post(PREFIX + "/namespaces/{namespace}/" + PLURAL)
    async def create(request: Request, namespace: str) -> Response:
        """A claim; the answer is the sandbox as the next read shows it."""
        body = await read_body(
            request, SandboxObject, media_type=_json_only, max_depth=MAX_BODY_DEPTH
        )
        try:  # after the body, so that the refusal names the object
            _refuse_dry_run(request.query_params.getlist("dryRun"))
        except ApiError as error:
            raise named(error, subject_of(body.metadata) if body else "") from None
        wanted = create_request(namespace, body, store.now())
        key = await _call(wanted.claim_key, aliases, store.has_template)
        granted = await _call(
            store.claim,
            wanted.namespace,
            wanted.name,
            key,
            wanted.ttl_seconds,
            details=_details(wanted.subject or wanted.name),
        )
        return answer(store.object_of(granted.located), status=201)

    @app.delete(PREFIX + "/namespaces/{namespace}/" + PLURAL + "/{name}")
    async def delete(request: Request, namespace: str, name: str) -> Response:
        _refuse_dry_run(request.query_params.getlist("dryRun"), name)
        options = await read_body(
            request, DeleteOptions, required=False, media_type=_json_only, max_depth=MAX_BODY_DEPTH
        )
        if options is not None:
            _refuse_dry_run(options.dryRun, name)
        located = await _locate(store, namespace, name)
        obj = store.object_of(located)
        await _call(store.release, located, details=_details(name))
        return answer(obj)


async def _locate(store: SandboxStore, namespace: str, name: str) -> Located:
    """The sandbox of ``namespace`` named ``name``, else the one whose id it is; 404."""
    details = _details(name)
    located = await _call(store.locate, namespace, name, details=details)
    if located is None and id_problem(name) is None:
        located = await _call(store.locate_claim, SandboxId.parse(name), namespace, details=details)
    if located is None:
        raise _not_found(name)
    return located


class DeleteOptions(Model, frozen=True):
    """What a delete reads of its ``DeleteOptions`` body: only ``dryRun``."""

    dryRun: Any = None


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is over {limit} bytes")


# --- list and watch ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Watching:
    interval: float
    bookmark_interval: float
    stopping: Callable[[], bool]


async def _read_collection(
    store: SandboxStore, request: Request, namespace: str | None, watching: _Watching
) -> Response:
    """A list, or a watch (``watch=true``), of the sandboxes a query selects."""
    params = request.query_params
    try:
        query = Query.parse(
            namespace, params.get("labelSelector", ""), params.get("fieldSelector", "")
        )
    except InvalidValueError as error:
        raise ApiError(400, str(error)) from None
    version = _resource_version(params.get("resourceVersion"))
    match = params.get("resourceVersionMatch") or ""
    if match not in MATCHES:
        raise _invalid("resourceVersionMatch", match, "expected NotOlderThan or Exact")
    as_table = tables.wants_table(request.headers.get("accept", ""))
    if _flag(params.get("watch"), "watch"):  # a watch list sends NotOlderThan with no version
        return await _watch(store, params, query, version, as_table, watching)
    if match and version is None:
        raise _invalid("resourceVersionMatch", match, "needs a resourceVersion")
    return await _list(store, params, query, version, match, as_table)


async def _watch(
    store: SandboxStore,
    params: Mapping[str, str],
    query: Query,
    version: int | None,
    as_table: bool,
    watching: _Watching,
) -> Response:
    timeout = _non_negative_int(params.get("timeoutSeconds"), "timeoutSeconds")
    watch = store.watch(
        query,
        version or None,  # "0" is "any version": start from the current state
        _flag(params.get("sendInitialEvents"), "sendInitialEvents"),
    )
    bookmarks = _flag(params.get("allowWatchBookmarks"), "allowWatchBookmarks")
    try:
        opening = await _call(watch.open)
    except ApiError as error:
        if error.code != 410:
            raise
        return StreamingResponse(_expired_stream(error), media_type=JSON)
    events = _watch_stream(
        store, watch, opening, as_table, timeout or DEFAULT_WATCH_TIMEOUT, bookmarks, watching
    )
    return StreamingResponse(events, media_type=JSON)


async def _list(
    store: SandboxStore,
    params: Mapping[str, str],
    query: Query,
    version: int | None,
    match: str,
    as_table: bool,
) -> Response:
    limit = _non_negative_int(params.get("limit"), "limit")
    token = params.get("continue") or None
    if token and version:
        raise _invalid("resourceVersion", str(version), "not allowed with continue")
    page = await _call(store.list, query, limit or None, token)
    if version and (version > page.version or (match == "Exact" and version != page.version)):
        # A version from another replica, or one this server no longer lists at.
        raise _gone(Expired(version, None, page.version))
    metadata: dict[str, Any] = {"resourceVersion": str(page.version)}
    if page.continue_token:
        metadata["continue"] = page.continue_token
    if page.remaining is not None:
        metadata["remainingItemCount"] = page.remaining
    if as_table:
        body = tables.table(page.items, store.now(), str(page.version))
        body["metadata"] = metadata
        return answer(body)
    return answer(
        {
            "apiVersion": SANDBOXES.api_version,
            "kind": SANDBOXES.list_kind,
            "metadata": metadata,
            "items": page.items,
        }
    )


async def _watch_stream(
    store: SandboxStore,
    watch: Watch,
    opening: list[WatchEvent],
    as_table: bool,
    timeout: float,
    bookmarks: bool,
    watching: _Watching,
) -> AsyncIterator[bytes]:
    """One JSON event per line: the opening events, then the changes as they come, until
    the timeout or the server stops. Starlette cancels this generator when the client
    goes away."""
    loop = asyncio.get_running_loop()
    woken = asyncio.Event()

    def wake() -> None:  # called from the thread whose sync logged a change
        with contextlib.suppress(RuntimeError):  # the loop has closed
            loop.call_soon_threadsafe(woken.set)

    unsubscribe = store.subscribe(wake)
    try:
        deadline = anyio.current_time() + timeout
        next_bookmark = anyio.current_time() + watching.bookmark_interval
        for event in opening:
            yield _event_line(event, as_table, store)
        while True:
            left = deadline - anyio.current_time()
            if left <= 0:
                return
            with anyio.move_on_after(min(watching.interval, left)):
                await woken.wait()
            woken.clear()
            if anyio.current_time() >= deadline or watching.stopping():
                return
            try:
                events = await run_in_threadpool(watch.poll)
            except Expired as error:  # fell further behind than the log retains
                yield _error_line(_gone(error))
                return
            except Exception:  # a failed poll skips its tick; the cursor is unchanged
                log.exception("a sandbox watch poll failed; skipping this tick")
                continue
            for event in events:
                yield _event_line(event, as_table, store)
            if bookmarks and anyio.current_time() >= next_bookmark:
                next_bookmark = anyio.current_time() + watching.bookmark_interval
                yield _event_line(watch.progress(), as_table, store)
    finally:
        unsubscribe()


async def _expired_stream(error: ApiError) -> AsyncIterator[bytes]:
    yield _error_line(error)


def _error_line(error: ApiError) -> bytes:
    return (
        json.dumps({"type": "ERROR", "object": error.body()}, separators=(",", ":")).encode()
        + b"\n"
    )


def _event_line(event: WatchEvent, as_table: bool, store: SandboxStore) -> bytes:
    obj = event.object
    if as_table and event.type != BOOKMARK:
        obj = tables.table([obj], store.now())
    return json.dumps({"type": event.type, "object": obj}, separators=(",", ":")).encode() + b"\n"


def _resource_version(value: str | None) -> int | None:
    """None when absent or empty; 400 naming the field when it is not a version."""
    if value is None or value == "":
        return None
    if not value.isascii() or not value.isdigit():
        raise _invalid("resourceVersion", value, "expected a resourceVersion this server gave")
    return int(value)


def _gone(error: Expired) -> ApiError:
    return ApiError(410, str(error), reason="Expired")


def _invalid(field: str, value: str, why: str) -> ApiError:
    cause = {"reason": "FieldValueInvalid", "field": field, "message": why}
    return ApiError(400, f"{field} {value!r}: {why}", details={"causes": [cause]})


# --- helpers -----------------------------------------------------------------------------


async def _call(fn: Callable[..., T], *args: Any, details: dict[str, Any] | None = None) -> T:
    """Run a blocking store call on the thread pool; its errors become Status errors."""
    return await blocking(fn, *args, translate=lambda error: api_error(error, details))


def _json_only(media_type: str) -> None:
    if media_type not in (JSON, "*/*", ""):
        raise ApiError(415, f"unsupported media type {media_type!r}: send {JSON}")


def _refuse_dry_run(values: object, name: str = "") -> None:
    if values:
        message = "dryRun is not supported: sandboxes are claimed for real"
        raise ApiError(400, message, details=_details(name) if name else None)


def _flag(value: str | None, name: str) -> bool:
    if value is None or value == "":
        return False
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ApiError(400, f"{name} {value!r}: expected true or false")


def _non_negative_int(value: str | None, name: str) -> int:
    if value is None or value == "":
        return 0
    if not value.isascii() or not value.isdigit():
        raise ApiError(400, f"{name} {value!r}: expected a whole number")
    return int(value)


def _details(name: str) -> dict[str, Any]:
    return {"name": name, "group": GROUP, "kind": PLURAL}


def _not_found(name: str) -> ApiError:
    return ApiError(404, f'{SANDBOXES.qualified} "{name}" not found', details=_details(name))


def _answer(_: Request, error: Exception) -> ApiError:
    if isinstance(error, RequestValidationError):
        return ApiError(400, f"invalid request: {error}")
    return api_error(error)


def _unmatched(status: int, detail: str) -> ApiError:
    if status == 404:
        return ApiError(404, NOT_FOUND_PATH)
    if status == 405:
        return ApiError(405, "the server does not allow this method on the requested resource")
    return ApiError(status, detail)

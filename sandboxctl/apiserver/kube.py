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
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from sandboxctl.apiserver import discovery, tables
from sandboxctl.apiserver.auth import Authenticated, KubeTokens
from sandboxctl.apiserver.creation import create_request, created_object, unknown_template
from sandboxctl.apiserver.discovery import GROUP, LIST_KIND, PLURAL, RESOURCE, VERSION
from sandboxctl.apiserver.status import NOT_FOUND_PATH, ApiError, api_error, status_body
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.sandboxes import API_VERSION
from sandboxctl.core.watching import BOOKMARK, WatchEvent
from sandboxctl.serving import BodyCap
from sandboxctl.store import Query, SandboxStore
from sandboxctl.store.errors import Expired
from sandboxctl.store.watch import Watch

log = logging.getLogger("sandboxctl.apiserver")

T = TypeVar("T")

PREFIX: Final = f"/apis/{GROUP}/{VERSION}"
DEFAULT_WATCH_TIMEOUT: Final = 1800.0  # seconds, when a watch names no timeoutSeconds
BOOKMARK_SECONDS: Final = 30.0  # between the bookmarks of a watch that allows them
MATCHES: Final = frozenset({"", "NotOlderThan", "Exact"})
JSON: Final = "application/json"
_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE: Final = frozenset({"0", "f", "F", "FALSE", "false", "False"})
MAX_BODY_BYTES: Final = 3 << 20  # a Kubernetes API server's default cap
MAX_BODY_DEPTH: Final = 64  # nesting of a body's arrays and objects; deeper is 400


def create_kube_app(
    store: SandboxStore,
    tokens: KubeTokens | None,
    watch_interval: float = 1.0,
    stopping: Callable[[], bool] = lambda: False,
    bookmark_interval: float = BOOKMARK_SECONDS,
) -> FastAPI:
    """The API app over ``store``, for the holders of ``tokens``. A watch wakes at once for
    this server's own writes and every ``watch_interval`` s for the inventories' changes.

    Open watches end (cleanly, as at their timeout) once ``stopping()`` is true: uvicorn's
    graceful shutdown waits for every open response, and a watch may run for half an hour.
    """
    if watch_interval <= 0:
        raise ValueError("watch_interval must be positive")
    app = FastAPI(title="sandboxctl apiserver", docs_url=None, redoc_url=None, openapi_url=None)
    watching = _Watching(watch_interval, bookmark_interval, stopping)

    # --- health (no token needed) -------------------------------------------------------

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

    # --- sandboxes ---------------------------------------------------------------------

    @app.get(f"{PREFIX}/{PLURAL}")
    async def list_all(request: Request) -> Response:
        return await _read_collection(store, request, None, watching)

    @app.get(PREFIX + "/namespaces/{namespace}/" + PLURAL)
    async def list_namespaced(request: Request, namespace: str) -> Response:
        return await _read_collection(store, request, namespace, watching)

    @app.get(PREFIX + "/namespaces/{namespace}/" + PLURAL + "/{name}")
    async def get(request: Request, namespace: str, name: str) -> Response:
        located = await _call(store.locate, namespace, name, details=_details(name))
        if located is None:
            raise _not_found(name)
        obj = store.object_of(located)
        if tables.wants_table(request.headers.get("accept", "")):
            return _json(tables.table([obj], store.now()))
        return _json(obj)

    @app.post(PREFIX + "/namespaces/{namespace}/" + PLURAL)
    async def create(request: Request, namespace: str) -> Response:
        _refuse_dry_run(request.query_params.getlist("dryRun"))
        body = await _body(request)
        now = store.now()
        wanted = create_request(namespace, body, now)
        if not await _call(store.has_template, wanted.key.template):
            raise unknown_template(wanted.key.template)
        granted = await _call(
            store.claim,
            wanted.namespace,
            wanted.name,
            wanted.key,
            wanted.ttl_seconds,
            details=_details(wanted.name),
        )
        version = store.version_of(wanted.namespace, wanted.name)
        obj = created_object(wanted, body, granted, now, version)
        return _json(obj, status=201)

    @app.delete(PREFIX + "/namespaces/{namespace}/" + PLURAL + "/{name}")
    async def delete(request: Request, namespace: str, name: str) -> Response:
        _refuse_dry_run(request.query_params.getlist("dryRun"))
        options = await _body(request, required=False)  # DeleteOptions: only dryRun is read
        if options is not None:
            if not isinstance(options, dict):
                raise ApiError(400, "the request body must be a DeleteOptions object")
            _refuse_dry_run(options.get("dryRun") or [])
        located = await _call(store.locate, namespace, name, details=_details(name))
        if located is None:
            raise _not_found(name)
        obj = store.object_of(located)
        await _call(store.release, located, details=_details(name))
        return _json(obj)

    _install_error_handlers(app)
    app.add_middleware(BodyCap, limit=MAX_BODY_BYTES, refuse=_too_large)
    if tokens is not None:  # None: authenticated outside it (delegated, behind aggregation)
        app.add_middleware(Authenticated, tokens=tokens)  # outermost: before any body is read
    return app


def _too_large(limit: int) -> bytes:
    body = status_body(413, f"the request body is over {limit} bytes")
    return json.dumps(body, separators=(",", ":")).encode()


# --- list and watch ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Watching:
    interval: float
    bookmark_interval: float
    stopping: Callable[[], bool]


async def _read_collection(
    store: SandboxStore, request: Request, namespace: str | None, watching: _Watching
) -> Response:
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
    if match and version is None:
        raise _invalid("resourceVersionMatch", match, "needs a resourceVersion")
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
        return _json(body)
    return _json(
        {"apiVersion": API_VERSION, "kind": LIST_KIND, "metadata": metadata, "items": page.items}
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
    try:
        return await run_in_threadpool(fn, *args)
    except ApiError:
        raise
    except Exception as error:
        translated = api_error(error, details)
        if translated.code == 500:
            log.exception("unexpected error serving a sandbox request")
        raise translated from error


async def _body(request: Request, required: bool = True) -> Any:
    raw = await request.body()
    if not raw.strip():
        if required:
            raise ApiError(400, "the request has no body")
        return None
    content_type = request.headers.get("content-type", JSON).split(";")[0].strip().lower()
    if content_type not in (JSON, "*/*", ""):
        raise ApiError(415, f"unsupported media type {content_type!r}: send {JSON}")
    try:
        body = json.loads(raw, parse_constant=_not_json)
    except (ValueError, UnicodeDecodeError) as error:
        raise ApiError(400, f"the request body is not JSON: {error}") from None
    except RecursionError:
        raise _too_deep() from None
    if _deeper_than(body, MAX_BODY_DEPTH):  # copying or answering it would recurse too far
        raise _too_deep()
    return body


def _not_json(constant: str) -> None:
    """NaN and Infinity: Python's reader takes them, JSON and every answer do not."""
    raise ValueError(f"{constant} is not a JSON value")


def _too_deep() -> ApiError:
    return ApiError(400, f"the request body nests deeper than {MAX_BODY_DEPTH} levels")


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest deeper than ``limit`` in ``value`` (no recursion)."""
    if not isinstance(value, dict | list):
        return False
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item
        for child in children:
            if isinstance(child, dict | list):
                if depth >= limit:
                    return True
                pending.append((child, depth + 1))
    return False


def _refuse_dry_run(values: object) -> None:
    if values:
        raise ApiError(400, "dryRun is not supported: sandboxes are claimed for real")


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
    return ApiError(404, f'{RESOURCE} "{name}" not found', details=_details(name))


def _json(body: dict[str, Any], status: int = 200) -> JSONResponse:
    return JSONResponse(body, status_code=status)


def _install_error_handlers(app: FastAPI) -> None:
    async def api_failure(_: Request, error: Exception) -> Response:
        assert isinstance(error, ApiError)
        return _json(error.body(), status=error.code)

    async def http_failure(_: Request, error: Exception) -> Response:
        assert isinstance(error, StarletteHTTPException)
        if error.status_code == 404:
            message = NOT_FOUND_PATH
        elif error.status_code == 405:
            message = "the server does not allow this method on the requested resource"
        else:
            message = str(error.detail)
        return _json(status_body(error.status_code, message), status=error.status_code)

    async def invalid_request(_: Request, error: Exception) -> Response:
        return _json(status_body(400, f"invalid request: {error}"), status=400)

    async def unexpected(_: Request, error: Exception) -> Response:
        # Starlette logs the traceback after this answer is sent.
        body = status_body(500, f"internal error: {type(error).__name__}: {error}")
        return _json(body, status=500)

    app.add_exception_handler(ApiError, api_failure)
    app.add_exception_handler(StarletteHTTPException, http_failure)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(Exception, unexpected)

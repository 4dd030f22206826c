"""The Kubernetes-style API for ``sandboxes.agents.x-k8s.io/v1beta1``, over one store.

Enough of the Kubernetes API for kubectl 1.35 and client-go style clients: discovery,
list (namespaced and across namespaces, with label and field selectors), get, watch,
create (a claim) and delete (a release), in JSON or in the Table form ``kubectl get``
prints. Every object and list carries ``apiVersion`` and ``kind``; every error is a
``Status`` (see ``status.py``).

What differs from a real API server, on purpose:

* Objects are synthesized from inventories, never stored, so there is no history.
  ``resourceVersion`` (and ``resourceVersionMatch``) on a list or watch is accepted and
  ignored: every watch opens by replaying the current view as ADDED events (a
  list-then-watch client sees each object twice), then reports what each poll of the
  store changed. With ``sendInitialEvents=true`` the replay ends with the BOOKMARK
  annotated ``k8s.io/initial-events-end: "true"``, which kubectl 1.35 ``wait`` and
  ``delete`` wait for. No periodic bookmarks are sent.
* ``limit`` and ``continue`` are accepted and ignored: a list always answers every item,
  with no continue token.
* A watch polls the store every ``watch_interval`` seconds, so a change is seen at the
  next poll after the node's inventory shows it.
* Delete answers 200 with the last object once the owning node released the claim; the
  object disappears from reads (and a watch reports DELETED) when the node's inventory
  drops it, which is what ``kubectl delete`` waits for.
* ``dryRun`` is refused with 400; update and patch are not served (405).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, Final, TypeVar

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from sandboxctl.apiserver import discovery, tables
from sandboxctl.apiserver.creation import create_request, created_object
from sandboxctl.apiserver.discovery import GROUP, LIST_KIND, PLURAL, RESOURCE, VERSION
from sandboxctl.apiserver.status import NOT_FOUND_PATH, ApiError, api_error, status_body
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.sandboxes import API_VERSION, sandbox_object
from sandboxctl.core.watching import BOOKMARK, WatchEvent
from sandboxctl.store import Query, SandboxStore
from sandboxctl.store.watch import Watcher, list_version

log = logging.getLogger("sandboxctl.apiserver")

T = TypeVar("T")

PREFIX: Final = f"/apis/{GROUP}/{VERSION}"
DEFAULT_WATCH_TIMEOUT: Final = 1800.0  # seconds, when a watch names no timeoutSeconds
JSON: Final = "application/json"
_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE: Final = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def create_kube_app(
    store: SandboxStore,
    watch_interval: float = 1.0,
    stopping: Callable[[], bool] = lambda: False,
) -> FastAPI:
    """The API app over ``store``; each open watch polls it every ``watch_interval`` s.

    Open watches end (cleanly, as at their timeout) once ``stopping()`` is true: uvicorn's
    graceful shutdown waits for every open response, and a watch may run for half an hour.
    """
    if watch_interval <= 0:
        raise ValueError("watch_interval must be positive")
    app = FastAPI(title="sandboxctl apiserver", docs_url=None, redoc_url=None, openapi_url=None)

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
        return await _read_collection(store, request, None, watch_interval, stopping)

    @app.get(PREFIX + "/namespaces/{namespace}/" + PLURAL)
    async def list_namespaced(request: Request, namespace: str) -> Response:
        return await _read_collection(store, request, namespace, watch_interval, stopping)

    @app.get(PREFIX + "/namespaces/{namespace}/" + PLURAL + "/{name}")
    async def get(request: Request, namespace: str, name: str) -> Response:
        located = await _call(store.locate, namespace, name, details=_details(name))
        if located is None:
            raise _not_found(name)
        obj = sandbox_object(located)
        if tables.wants_table(request.headers.get("accept", "")):
            return _json(tables.table([obj], store.clock.now()))
        return _json(obj)

    @app.post(PREFIX + "/namespaces/{namespace}/" + PLURAL)
    async def create(request: Request, namespace: str) -> Response:
        _refuse_dry_run(request.query_params.getlist("dryRun"))
        body = await _body(request)
        now = store.clock.now()
        wanted = create_request(namespace, body, now)
        granted = await _call(
            store.claim,
            wanted.namespace,
            wanted.name,
            wanted.key,
            wanted.ttl_seconds,
            details=_details(wanted.name),
        )
        obj = created_object(wanted, body, granted, now, str(uuid.uuid4()))
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
        await _call(store.release, located, details=_details(name))
        return _json(sandbox_object(located))

    _install_error_handlers(app)
    return app


# --- list and watch ----------------------------------------------------------------------


async def _read_collection(
    store: SandboxStore,
    request: Request,
    namespace: str | None,
    interval: float,
    stopping: Callable[[], bool],
) -> Response:
    params = request.query_params
    try:
        query = Query.parse(
            namespace, params.get("labelSelector", ""), params.get("fieldSelector", "")
        )
    except InvalidValueError as error:
        raise ApiError(400, str(error)) from None
    _non_negative_int(params.get("limit"), "limit")  # checked, then ignored: lists are whole
    as_table = tables.wants_table(request.headers.get("accept", ""))
    if _flag(params.get("watch"), "watch"):
        timeout = _non_negative_int(params.get("timeoutSeconds"), "timeoutSeconds")
        initial = _flag(params.get("sendInitialEvents"), "sendInitialEvents")
        watcher = Watcher(store, query)
        opening = await _call(watcher.open, initial)
        events = _watch_stream(
            store, watcher, opening, as_table, timeout or DEFAULT_WATCH_TIMEOUT, interval, stopping
        )
        return StreamingResponse(events, media_type=JSON)
    items = await _call(store.list, query)
    version = list_version(items)
    if as_table:
        return _json(tables.table(items, store.clock.now(), version))
    return _json(
        {
            "apiVersion": API_VERSION,
            "kind": LIST_KIND,
            "metadata": {"resourceVersion": version},
            "items": items,
        }
    )


async def _watch_stream(
    store: SandboxStore,
    watcher: Watcher,
    opening: list[WatchEvent],
    as_table: bool,
    timeout: float,
    interval: float,
    stopping: Callable[[], bool],
) -> AsyncIterator[bytes]:
    """One JSON event per line: the opening events, then each poll's changes, until the
    timeout or the server stops. Starlette cancels this generator when the client goes
    away."""
    deadline = anyio.current_time() + timeout
    for event in opening:
        yield _event_line(event, as_table, store)
    while True:
        left = deadline - anyio.current_time()
        if left <= 0:
            return
        await anyio.sleep(min(interval, left))
        if anyio.current_time() >= deadline or stopping():
            return
        try:
            events = await run_in_threadpool(watcher.tick)
        except Exception:  # a failed poll skips its tick; the known state is unchanged
            log.exception("a sandbox watch poll failed; skipping this tick")
            continue
        for event in events:
            yield _event_line(event, as_table, store)


def _event_line(event: WatchEvent, as_table: bool, store: SandboxStore) -> bytes:
    obj = event.object
    if as_table and event.type != BOOKMARK:
        obj = tables.table([obj], store.clock.now())
    return json.dumps({"type": event.type, "object": obj}, separators=(",", ":")).encode() + b"\n"


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
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise ApiError(400, f"the request body is not JSON: {error}") from None


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

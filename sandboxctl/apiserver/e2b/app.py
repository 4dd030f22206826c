"""The e2b-compatible control-plane API over one sandbox store.

Every request but ``GET /health`` carries ``X-API-Key``; the key decides the namespace
the request sees and drives (a sandbox of another namespace is 404, not 403). Every
non-2xx body is ``{"code": <status>, "message": <text>}``, which the SDK needs to raise
its typed exceptions. Options this fleet cannot honour are refused with 400 naming the
option, never ignored. See docs/e2b-compat.md for the endpoint table.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Final, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from sandboxctl.agentapi import LogEvent, SandboxRow, UsageSample, entry_from_row
from sandboxctl.apiserver.e2b.auth import Keys
from sandboxctl.apiserver.e2b.config import E2bConfig
from sandboxctl.apiserver.e2b.ids import ClaimIds, public_id, same_sandbox
from sandboxctl.apiserver.e2b.logs import entry_body, line_body, parse_v1, parse_v2, select
from sandboxctl.apiserver.e2b.metrics import metric_body, parse_sandbox_ids, parse_seconds
from sandboxctl.apiserver.e2b.models import detail_body, listed_body, sandbox_body
from sandboxctl.apiserver.e2b.network import create_policy, network_body
from sandboxctl.apiserver.e2b.network import update as network_update
from sandboxctl.apiserver.e2b.paging import (
    BadQuery,
    Filters,
    decode_cursor,
    encode_cursor,
    parse_limit,
    parse_metadata_filter,
    parse_order,
    parse_states,
    parse_time,
    sort_key,
)
from sandboxctl.apiserver.e2b.templates import template_body, with_builds_body
from sandboxctl.apiserver.errors import status_of
from sandboxctl.core.envvars import check_env
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.model import PoolKey
from sandboxctl.core.placement import NoNodeCapacity, NoWarmCapacity
from sandboxctl.core.snapshot import Located
from sandboxctl.serving import BodyCap
from sandboxctl.store import SandboxStore
from sandboxctl.store.errors import ClaimRoutingOff, NodeRefused, NodeUnavailable, NotFound

log = logging.getLogger("sandboxctl.apiserver.e2b")

T = TypeVar("T")

MAX_TIMEOUT: Final = 24 * 3600  # what a host agent grants at most
MAX_REFRESH: Final = 3600
MAX_BODY_BYTES: Final = 1 << 20  # every body is a small JSON object
NAME_PREFIX: Final = "e2b-"
NO_RETRY: Final = {"Should-Retry": "false"}
CREATE_FIELDS: Final = frozenset(
    {
        "templateID", "timeout", "metadata", "envVars", "autoPause", "autoPauseMemory",
        "autoResume", "allow_internet_access", "secure", "network", "mcp", "iam",
        "volumeMounts",
    }
)  # fmt: skip
UNSUPPORTED: Final = {
    "mcp": "MCP gateways are not served",
    "iam": "workload identity is not served",
    "volumeMounts": "volumes are not served",
}


class E2bError(Exception):
    def __init__(self, code: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.headers = headers or {}


def create_e2b_app(store: SandboxStore, config: E2bConfig) -> FastAPI:
    """The e2b API app over ``store``; ``config`` fixes keys, domain, secret and aliases."""
    app = FastAPI(title="sandboxctl e2b API", docs_url=None, redoc_url=None, openapi_url=None)
    keys = Keys(config.api_keys, config.allow_anonymous, config.namespace)
    ids = ClaimIds()

    def tenant(request: Request) -> str:
        namespace = keys.namespace(request.headers.get("x-api-key"))
        if namespace is None:
            raise E2bError(401, "invalid API key")
        return namespace

    async def locate(namespace: str, sandbox_id: str) -> Located:
        located = await _call(
            store.locate_claim,
            ids.claim_id(sandbox_id),
            namespace,
            lambda candidate: same_sandbox(sandbox_id, candidate),
        )
        if located is None:
            raise _not_found(sandbox_id)
        ids.remember(located.entry.id)
        return located

    async def read(located: Located, sandbox_id: str) -> SandboxRow:
        try:
            return await _call(store.read, located)
        except E2bError as error:
            if error.code == 404:
                raise _not_found(sandbox_id) from None
            raise

    def resolve_template(requested: str) -> PoolKey | None:
        """An alias's pool, else the template's own small pool if a fresh node has any
        pool of it; None when neither."""
        if requested in config.aliases:
            template, size = config.aliases[requested]
            return PoolKey(template, "none", size)
        return PoolKey(requested, "none", "small") if store.has_template(requested) else None

    # --- health and templates -----------------------------------------------------------

    @app.get("/health")
    def health() -> Response:
        return Response(status_code=204)

    @app.get("/templates/aliases/{alias}")
    async def template_alias(request: Request, alias: str) -> Response:
        tenant(request)
        if alias in config.aliases:
            return _json({"templateID": config.aliases[alias][0], "public": True})
        if alias in await _call(store.templates):  # a template's name is its own alias
            return _json({"templateID": alias, "public": True})
        raise E2bError(404, f"template alias {alias!r} not found")

    @app.get("/templates")
    @app.get("/v2/templates")
    async def templates(request: Request) -> Response:
        tenant(request)
        now = store.now()
        names = await _call(store.templates)
        entries = await _call(store.template_entries)
        return _json([template_body(config, name, now, entries.get(name)) for name in names])

    @app.get("/templates/{template_id}")
    async def one_template(request: Request, template_id: str) -> Response:
        tenant(request)
        names = await _call(store.templates)
        name = config.aliases[template_id][0] if template_id in config.aliases else template_id
        if name not in names:
            raise E2bError(404, f"template {template_id!r} not found")
        entries = await _call(store.template_entries)
        return _json(with_builds_body(config, name, store.now(), entries.get(name)))

    # --- create ------------------------------------------------------------------------

    @app.post("/sandboxes")
    @app.post("/v2/sandboxes")
    async def create(request: Request) -> Response:
        namespace = tenant(request)
        body = await _object(request)
        unknown = sorted(set(body) - CREATE_FIELDS)
        if unknown:
            raise E2bError(400, f"unsupported option {unknown[0]!r}: not known to this server")
        requested = body.get("templateID")
        if not isinstance(requested, str) or not requested:
            raise E2bError(400, "templateID: required, a template id or alias")
        timeout = _int(body, "timeout", 1, MAX_TIMEOUT, config.default_timeout)
        metadata = _str_map(body, "metadata")
        # Stored with the claim by the owning agent and set by envd for every command;
        # never listed, since values may be secrets. Checked here too, so a bad name is
        # a 400 even when no node has room.
        env_vars = _str_map(body, "envVars")
        try:
            check_env(env_vars, "envVars")
        except InvalidValueError as error:
            raise E2bError(400, str(error)) from None
        internet = _bool(body, "allow_internet_access", False)
        auto_pause = _bool(body, "autoPause", False)
        _refuse_unsupported(body, internet, auto_pause)
        try:
            network = create_policy(internet, body.get("network"))
        except InvalidValueError as error:
            raise E2bError(400, str(error)) from None
        key = await _call(resolve_template, requested)
        if key is None:
            raise E2bError(404, f"template {requested!r} not found")
        key = PoolKey(key.template, "egress" if internet else "none", key.size)
        name = NAME_PREFIX + secrets.token_hex(5)
        granted = await _call(
            store.claim,
            namespace,
            name,
            key,
            timeout,
            metadata,
            "pause" if auto_pause else "destroy",
            env=env_vars,
            network=network,
        )
        ids.remember(granted.claim_id)
        reply = sandbox_body(
            config,
            claim_id=granted.claim_id,
            node=granted.node,
            template=key.template,
            claim_token=granted.token,
            requested=requested,
            private=not network.public_traffic,
        )
        return _json(reply, status=201)

    # --- list ----------------------------------------------------------------------------

    async def listing(request: Request, paged: bool) -> Response:
        namespace = tenant(request)
        params = request.query_params
        try:
            filters = Filters(
                states=parse_states(params.get("state")),
                metadata=tuple(parse_metadata_filter(params.get("metadata") or "").items()),
                templates=_templates(config, params.get("template")),
                started_after=parse_time("startedAfter", params.get("startedAfter")),
            )
            limit = parse_limit(params.get("limit")) if paged else None
            descending = parse_order(params.get("order"))
            cursor = decode_cursor(params.get("nextToken")) if paged else None
        except BadQuery as error:
            raise E2bError(400, str(error)) from None

        found, following, now = await _call(
            store.page, namespace, sort_key, filters.accepts, cursor, descending, limit
        )
        items = [listed_body(config, located, now) for located in found]
        headers = {"X-Next-Token": encode_cursor(following)} if following is not None else {}
        return JSONResponse(items, headers=headers)

    @app.get("/v2/sandboxes")
    async def list_v2(request: Request) -> Response:
        return await listing(request, paged=True)

    @app.get("/sandboxes")
    async def list_v1(request: Request) -> Response:
        return await listing(request, paged=False)

    # --- metrics of several (before /sandboxes/{sandbox_id}, which would take "metrics") --

    @app.get("/sandboxes/metrics")
    async def many_metrics(request: Request) -> Response:
        namespace = tenant(request)
        try:
            wanted = parse_sandbox_ids(request.query_params.get("sandbox_ids"))
        except BadQuery as error:
            raise E2bError(400, str(error)) from None

        async def newest(sandbox_id: str) -> tuple[str, UsageSample | None]:
            try:
                located = await locate(namespace, sandbox_id)
                samples = await _call(store.usage, located, latest=True)
            except E2bError as error:
                if error.code == 404:  # unknown or gone: left out, as upstream
                    return sandbox_id, None
                raise
            return public_id(located.entry.id), samples[-1] if samples else None

        found = await asyncio.gather(*(newest(sandbox_id) for sandbox_id in wanted))
        body = {sid: metric_body(sample) for sid, sample in found if sample is not None}
        return _json({"sandboxes": body})

    # --- one sandbox ---------------------------------------------------------------------

    @app.get("/sandboxes/{sandbox_id}")
    async def get_info(request: Request, sandbox_id: str) -> Response:
        namespace = tenant(request)
        located = await locate(namespace, sandbox_id)
        row = await read(located, sandbox_id)
        live = Located(located.node, entry_from_row(row))
        now = store.now()
        detail = detail_body(config, live, now, row.token)
        if row.network is not None:
            detail["allowInternetAccess"] = row.network.internet
            detail["network"] = network_body(row.network)
        return _json(detail)

    @app.delete("/sandboxes/{sandbox_id}")
    async def kill(request: Request, sandbox_id: str) -> Response:
        namespace = tenant(request)
        located = await locate(namespace, sandbox_id)
        await read(located, sandbox_id)  # the inventory may still list one already gone
        await _call(store.release, located)
        return Response(status_code=204)

    @app.put("/sandboxes/{sandbox_id}/network")
    async def set_network(request: Request, sandbox_id: str) -> Response:
        namespace = tenant(request)
        body = await _object(request)
        try:
            change = network_update(body)
        except InvalidValueError as error:
            raise E2bError(400, str(error)) from None
        located = await locate(namespace, sandbox_id)
        await _call(store.set_network, located, change)
        return Response(status_code=204)

    @app.post("/sandboxes/{sandbox_id}/timeout")
    async def set_timeout(request: Request, sandbox_id: str) -> Response:
        namespace = tenant(request)
        body = await _object(request)
        if "timeout" not in body:
            raise E2bError(400, "timeout: required, in seconds")
        timeout = _int(body, "timeout", 1, MAX_TIMEOUT, 0)
        located = await locate(namespace, sandbox_id)
        await _call(store.renew, located, timeout)
        return Response(status_code=204)

    @app.post("/sandboxes/{sandbox_id}/refreshes")
    async def refresh(request: Request, sandbox_id: str) -> Response:
        namespace = tenant(request)
        body = await _object(request, required=False)
        duration = _int(body, "duration", 0, MAX_REFRESH, 0) or config.default_timeout
        located = await locate(namespace, sandbox_id)
        await _call(store.renew, located, duration)
        return Response(status_code=204)

    @app.post("/sandboxes/{sandbox_id}/connect")
    @app.post("/v2/sandboxes/{sandbox_id}/connect")
    async def connect(request: Request, sandbox_id: str) -> Response:
        namespace = tenant(request)
        body = await _object(request, required=False)
        timeout = _int(body, "timeout", 1, MAX_TIMEOUT, config.default_timeout)
        if _bool(body, "memory", True) is False:
            raise E2bError(400, "memory: false (resume by reboot) is not supported")
        located = await locate(namespace, sandbox_id)
        row = await read(located, sandbox_id)
        resumed = row.hibernated
        if resumed:
            await _call(store.resume, located)
            row = await read(located, sandbox_id)
        wanted_end = store.now() + timedelta(seconds=timeout)
        if row.deadline is None or wanted_end > row.deadline:
            await _call(store.renew, located, timeout)  # extends; never shortens
        return _json(_sandbox_from_row(config, located, row), status=201 if resumed else 200)

    @app.post("/sandboxes/{sandbox_id}/pause")
    async def pause(request: Request, sandbox_id: str) -> Response:
        namespace = tenant(request)
        body = await _object(request, required=False)
        if _bool(body, "memory", True) is False:
            raise E2bError(400, "memory: false (pause without memory) is not supported")
        _bool(body, "requireHealthyGuest", False)
        located = await locate(namespace, sandbox_id)
        await _call(store.pause, located)
        return Response(status_code=204)

    @app.post("/sandboxes/{sandbox_id}/resume")
    async def resume(request: Request, sandbox_id: str) -> Response:
        namespace = tenant(request)
        body = await _object(request, required=False)
        if _bool(body, "autoPause", False):
            raise E2bError(400, "autoPause: true on resume is not supported")
        timeout = _int(body, "timeout", 1, MAX_TIMEOUT, 0)
        located = await locate(namespace, sandbox_id)
        await _call(store.resume, located)
        if timeout:
            await _call(store.renew, located, timeout)
        row = await read(located, sandbox_id)
        return _json(_sandbox_from_row(config, located, row), status=201)

    @app.get("/sandboxes/{sandbox_id}/metrics")
    async def sandbox_metrics(request: Request, sandbox_id: str) -> Response:
        namespace = tenant(request)
        start, end = _window(request)
        located = await locate(namespace, sandbox_id)
        try:
            samples = await _call(store.usage, located, start, end)
        except E2bError as error:
            if error.code == 404:
                raise _not_found(sandbox_id) from None
            raise
        return _json([metric_body(sample) for sample in samples])

    async def log_events(request: Request, sandbox_id: str) -> list[LogEvent]:
        """The sandbox's log, live or killed; empty for a sandbox whose log no node keeps
        (an older agent); 404 for one that is neither logged nor known to this key."""
        namespace = tenant(request)
        spellings = list(dict.fromkeys((ids.claim_id(sandbox_id), sandbox_id)))
        found = await _call(store.log_of, spellings, namespace)
        if found is not None:
            return list(found.events)
        await locate(namespace, sandbox_id)
        return []

    @app.get("/sandboxes/{sandbox_id}/logs")
    async def logs_v1(request: Request, sandbox_id: str) -> Response:
        query = _query(parse_v1, request)
        chosen = select(await log_events(request, sandbox_id), query)
        return _json(
            {
                "logs": [line_body(event) for event in chosen],
                "logEntries": [entry_body(event) for event in chosen],
            }
        )

    @app.get("/v2/sandboxes/{sandbox_id}/logs")
    async def logs_v2(request: Request, sandbox_id: str) -> Response:
        query = _query(parse_v2, request)
        chosen = select(await log_events(request, sandbox_id), query)
        return _json({"logs": [entry_body(event) for event in chosen]})

    _install_error_handlers(app)
    app.add_middleware(BodyCap, limit=MAX_BODY_BYTES, refuse=_too_large)
    return app


# --- request bodies ----------------------------------------------------------------------


async def _object(request: Request, required: bool = True) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        if required:
            raise E2bError(400, "the request needs a JSON object body")
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise E2bError(400, f"the request body is not JSON: {error}") from None
    except RecursionError:
        raise E2bError(400, "the request body is not JSON: nested too deeply") from None
    if not isinstance(body, dict):
        raise E2bError(400, "the request body must be a JSON object")
    return body


def _window(request: Request) -> tuple[int | None, int | None]:
    """A metrics query's ``start`` and ``end`` (unix seconds)."""
    params = request.query_params
    try:
        return parse_seconds("start", params.get("start")), parse_seconds("end", params.get("end"))
    except BadQuery as error:
        raise E2bError(400, str(error)) from None


def _query(parse: Callable[[Mapping[str, str]], T], request: Request) -> T:
    try:
        return parse(request.query_params)
    except BadQuery as error:
        raise E2bError(400, str(error)) from None


def _int(body: dict[str, Any], name: str, low: int, high: int, default: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise E2bError(400, f"{name}: expected a whole number of seconds, got {value!r}")
    if not low <= value <= high:
        raise E2bError(400, f"{name}: {value} is outside {low}..{high}")
    return value


def _bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise E2bError(400, f"{name}: expected true or false, got {value!r}")
    return value


def _str_map(body: dict[str, Any], name: str) -> dict[str, str]:
    value = body.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise E2bError(400, f"{name}: expected an object of string values")
    return value


def _refuse_unsupported(body: dict[str, Any], internet: bool, auto_pause: bool) -> None:
    if _bool(body, "secure", True) is False:
        raise E2bError(400, "secure: false is not supported: every sandbox gets an access token")
    for option, why in UNSUPPORTED.items():
        if body.get(option) not in (None, [], {}):
            raise E2bError(400, f"{option}: not supported: {why}")
    if _bool(body, "autoPauseMemory", True) is False:
        raise E2bError(400, "autoPauseMemory: false is not supported: a pause keeps memory")
    resume = body.get("autoResume")
    if resume is not None:
        if not isinstance(resume, dict) or not isinstance(resume.get("enabled", False), bool):
            raise E2bError(400, 'autoResume: expected {"enabled": true|false}')
        if resume.get("enabled"):
            raise E2bError(400, "autoResume.enabled: not supported: resume with connect")
    if auto_pause and internet:
        raise E2bError(
            400,
            "autoPause with allow_internet_access: not supported: egress sandboxes "
            "cannot be paused on expiry",
        )


def _templates(config: E2bConfig, text: str | None) -> frozenset[str] | None:
    if not text:
        return None
    if text in config.aliases:
        return frozenset({text, config.aliases[text][0]})
    return frozenset({text})


def _sandbox_from_row(config: E2bConfig, located: Located, row: SandboxRow) -> dict[str, Any]:
    return sandbox_body(
        config,
        claim_id=located.entry.id,
        node=located.node,
        template=row.key.template,
        claim_token=row.token or "",
        private=row.network is not None and not row.network.public_traffic,
    )


# --- errors ------------------------------------------------------------------------------


async def _call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking store call on the thread pool; its errors become e2b errors."""
    try:
        return await run_in_threadpool(fn, *args, **kwargs)
    except E2bError:
        raise
    except Exception as error:
        raise _translate(error) from error


def _translate(error: Exception) -> E2bError:
    if isinstance(error, NotFound):
        return E2bError(404, str(error))
    if isinstance(error, NodeRefused):
        if error.status == 429:
            return E2bError(429, f"at capacity: {error.message}", NO_RETRY)
        return E2bError(error.status, error.message)
    if isinstance(error, NoNodeCapacity):
        # e2b's answer when a team is at its concurrent-sandbox limit: the SDK raises
        # RateLimitException; Should-Retry: false, since retrying at once will not help.
        return E2bError(429, f"at capacity: {error}", NO_RETRY)
    if isinstance(error, NoWarmCapacity):
        return E2bError(503, f"no warm sandbox available right now; retry: {error}")
    if isinstance(error, NodeUnavailable):
        # Why names the fleet's own addresses: the log has it, a tenant does not.
        log.warning("a node failed an e2b request: %s", error)
        return E2bError(502, "the sandbox's node is unreachable", NO_RETRY)
    if isinstance(error, ClaimRoutingOff):
        return E2bError(503, str(error), NO_RETRY)
    code = status_of(error)
    if code == 500:
        log.error("unexpected error serving an e2b request", exc_info=error)
        return E2bError(500, f"internal error: {type(error).__name__}")
    return E2bError(code, str(error), NO_RETRY if code >= 500 else None)


def _too_large(limit: int) -> bytes:
    return json.dumps({"code": 413, "message": f"the request body is over {limit} bytes"}).encode()


def _not_found(sandbox_id: str) -> E2bError:
    return E2bError(404, f"sandbox {public_id(sandbox_id)!r} not found")


def _json(body: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse(body, status_code=status, headers=headers)


def _error(code: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return _json({"code": code, "message": message}, status=code, headers=headers)


def _install_error_handlers(app: FastAPI) -> None:
    async def e2b_failure(_: Request, error: Exception) -> Response:
        assert isinstance(error, E2bError)
        return _error(error.code, error.message, error.headers)

    async def http_failure(_: Request, error: Exception) -> Response:
        assert isinstance(error, StarletteHTTPException)
        messages = {404: "no such endpoint", 405: "method not allowed on this endpoint"}
        message = messages.get(error.status_code, str(error.detail))
        return _error(error.status_code, message)

    async def invalid_request(_: Request, error: Exception) -> Response:
        return _error(400, f"invalid request: {error}")

    async def unexpected(_: Request, error: Exception) -> Response:
        return _error(500, f"internal error: {type(error).__name__}")

    app.add_exception_handler(E2bError, e2b_failure)
    app.add_exception_handler(StarletteHTTPException, http_failure)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(Exception, unexpected)

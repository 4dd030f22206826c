"""The agent's HTTP API v1: JSON in and out, errors as ``{"error": "..."}``.

Auth: with a root token, every call needs ``Authorization: Bearer <root>``, except the
per-sandbox verbs (release, renew, hibernate, wake), which also take that sandbox's own
token, and ``/metrics``, which is open. envd, the e2b data plane of each sandbox
(``sandboxctl.envd``), is served under ``/v1/sandboxes/{id}/envd/`` with the same
root-or-sandbox auth, outside the body cap. Without a root token (development mode) nothing is
checked, and the CLI only allows a loopback listen address.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandboxctl.core.model import PoolKey
from sandboxctl.envd.app import PATH_PATTERN, create_envd_app
from sandboxctl.sandboxd.agent import Agent, ClaimRequest
from sandboxctl.sandboxd.errors import AgentError, PayloadTooLarge, Unauthorized
from sandboxctl.sandboxd.metrics import CONTENT_TYPE, AgentMetrics
from sandboxctl.sandboxd.runtime import SIZE_LIMITS, RuntimeFailure, Size
from sandboxctl.sandboxd.state import SandboxRecord

MAX_BODY_BYTES = 1 << 20
ENVD_PATH = re.compile(PATH_PATTERN)
log = logging.getLogger("sandboxctl.sandboxd")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ClaimBody(_Strict):
    template: str = Field(min_length=1)
    net: str = "none"
    size: str = "small"
    ttl_seconds: int = 0
    claim_ref: str = ""
    metadata: dict[str, str] = Field(default_factory=dict)
    on_expire: str = "destroy"
    env: dict[str, str] = Field(default_factory=dict)  # stored, never returned
    no_redirect: bool = False  # accepted for upstream clients; this agent never redirects


class RenewBody(_Strict):
    ttl_seconds: int = 0
    on_expire: str | None = None


class PoolBody(_Strict):
    template: str = Field(min_length=1)
    net: str = "none"
    size: str = "small"
    warm: int = Field(ge=0)


class PoolsBody(_Strict):
    pools: list[PoolBody]


def create_app(agent: Agent, root_token: str | None) -> FastAPI:
    metrics = AgentMetrics(agent.info)
    app = FastAPI(title="sandboxd", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.metrics = metrics

    async def root(request: Request) -> None:
        if root_token is None:
            return
        if not _matches(_bearer(request), root_token):
            raise Unauthorized("a root token is required")

    def may_act_on(request: Request, sandbox_id: str) -> bool:
        if root_token is None:
            return True
        offered = _bearer(request)
        if _matches(offered, root_token):
            return True
        # An unknown id and a wrong token answer alike, so ids cannot be probed.
        token = agent.token_of(sandbox_id) if offered else None
        return token is not None and _matches(offered, token)

    async def root_or_sandbox(request: Request, sandbox_id: str) -> None:
        if not may_act_on(request, sandbox_id):
            raise Unauthorized("the root token or this sandbox's token is required")

    as_root = [Depends(root)]
    as_root_or_sandbox = [Depends(root_or_sandbox)]

    @app.get("/v1/info", dependencies=as_root)
    def info() -> dict[str, Any]:
        return agent.info()

    @app.get("/v1/sandboxes", dependencies=as_root)
    def list_sandboxes(claim_ref: str | None = None) -> dict[str, Any]:
        return {"sandboxes": [sandbox_json(r) for r in agent.sandboxes(claim_ref)]}

    @app.get("/v1/sandboxes/{sandbox_id}", dependencies=as_root)
    def get_sandbox(sandbox_id: str) -> dict[str, Any]:
        return sandbox_json(agent.get(sandbox_id), with_token=True)

    @app.post("/v1/claim", dependencies=as_root)
    def claim(body: ClaimBody) -> dict[str, Any]:
        record = agent.claim(
            ClaimRequest(
                template=body.template,
                net=body.net,
                size=body.size,
                ttl_seconds=body.ttl_seconds,
                claim_ref=body.claim_ref,
                metadata=body.metadata,
                on_expire=body.on_expire,
                env=body.env,
            )
        )
        return {
            "id": record.id,
            "token": record.token,
            "deadline": _iso(record.deadline),
            "owner_addr": agent.settings.advertise_addr,
        }

    @app.post(
        "/v1/sandboxes/{sandbox_id}/release", status_code=204, dependencies=as_root_or_sandbox
    )
    def release(sandbox_id: str) -> Response:
        agent.release(sandbox_id)
        return Response(status_code=204)

    @app.post("/v1/sandboxes/{sandbox_id}/renew", dependencies=as_root_or_sandbox)
    def renew(sandbox_id: str, body: RenewBody) -> dict[str, Any]:
        record = agent.renew(sandbox_id, body.ttl_seconds, body.on_expire)
        return {"deadline": _iso(record.deadline)}

    @app.post(
        "/v1/sandboxes/{sandbox_id}/hibernate", status_code=204, dependencies=as_root_or_sandbox
    )
    def hibernate(sandbox_id: str) -> Response:
        agent.hibernate(sandbox_id)
        return Response(status_code=204)

    @app.post("/v1/sandboxes/{sandbox_id}/wake", status_code=204, dependencies=as_root_or_sandbox)
    def wake(sandbox_id: str) -> Response:
        agent.wake(sandbox_id)
        return Response(status_code=204)

    @app.put("/v1/pools", dependencies=as_root)
    def put_pools(body: PoolsBody) -> dict[str, Any]:
        targets: dict[PoolKey, int] = {}
        for pool in body.pools:
            key = PoolKey.of(pool.template, pool.net, pool.size)
            targets[key] = targets.get(key, 0) + pool.warm
        agent.set_pools(targets)
        return agent.info()

    @app.get("/metrics")
    def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    _install_error_handlers(app)
    app.middleware("http")(_counting(metrics))
    # envd streams large bodies both ways: it bypasses the body cap and the middleware
    envd = create_envd_app(agent, may_act_on)
    app.state.envd = envd
    return BodyLimit(app, envd=envd)  # type: ignore[return-value]


def sandbox_json(record: SandboxRecord, with_token: bool = False) -> dict[str, Any]:
    # Never the claim's env: its values may be secrets, and every reader of the fleet
    # (the mesh inventory, the API servers) reads these rows.
    limits = SIZE_LIMITS[Size(record.size)]
    body: dict[str, Any] = {
        "id": record.id,
        "key": {"template": record.template, "net": record.net, "size": record.size},
        "deadline": _iso(record.deadline),
        "claimed_at": _iso(record.claimed_at),
        "hibernated": record.hibernated,
        "claim_ref": record.claim_ref,
        "metadata": record.metadata,
        "cpu_count": limits.cpu_count,
        "mem_total_bytes": limits.memory_bytes,
    }
    if with_token:
        body["token"] = record.token
    return body


def _iso(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _bearer(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _matches(offered: str, expected: str) -> bool:
    return bool(offered) and hmac.compare_digest(offered.encode(), expected.encode())


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(AgentError)
    async def agent_error(_: Request, error: AgentError) -> JSONResponse:
        return _error(error.status, str(error))

    @app.exception_handler(RuntimeFailure)
    async def runtime_failure(_: Request, error: RuntimeFailure) -> JSONResponse:
        log.error("%s", error)
        return _error(500, str(error))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, error: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return _error(500, f"internal error: {type(error).__name__}")

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        return _error(400, _validation_message(error.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        return _error(error.status_code, str(error.detail).lower())


def _validation_message(errors: Any) -> str:
    first: Mapping[str, Any] = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return "request body is not valid JSON"
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    field = ".".join(location)
    message = str(first.get("msg", "invalid request"))
    if first.get("type") == "extra_forbidden":
        message = "unknown field"
    if first.get("type") == "missing" and not location:
        return "a JSON object body is required"
    return f"{field}: {message}" if field else message


Handler = Callable[[Request], Awaitable[Response]]


def _counting(metrics: AgentMetrics) -> Callable[[Request, Handler], Awaitable[Response]]:
    async def count(request: Request, call_next: Handler) -> Response:
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        metrics.requests.labels(path, request.method, str(response.status_code)).inc()
        return response

    return count


class BodyLimit:
    """Refuse request bodies over 1 MiB with 413, whether announced or streamed.

    The body is read here, up to the cap, and replayed to the app: every route takes a
    small JSON body, so buffering costs nothing and the app never sees a cut-off stream.
    """

    def __init__(
        self, app: ASGIApp, limit: int = MAX_BODY_BYTES, envd: ASGIApp | None = None
    ) -> None:
        self.app = app
        self.limit = limit
        self.envd = envd
        self.state = getattr(app, "state", None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.envd is not None and ENVD_PATH.match(scope["path"]):
            await self.envd(scope, receive, send)
            return
        too_large = PayloadTooLarge(f"request body over {self.limit} bytes")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await _send_error(send, too_large)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await _send_error(send, too_large)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)


async def _send_error(send: Send, error: AgentError) -> None:
    body = json.dumps({"error": str(error)}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": error.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})

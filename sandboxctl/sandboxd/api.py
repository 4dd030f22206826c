"""The agent's HTTP API v1: JSON in and out, errors as ``{"error": "..."}``.

Auth: with a root token, every call needs ``Authorization: Bearer <root>``, except the
per-sandbox verbs (release, renew, hibernate, wake), which also take that sandbox's own
token, and ``/healthz``, which is open. ``/metrics`` needs the root token too: it names
every sandbox, which the e2b API shows each tenant only of its own, and a sandbox id is
enough to reach a public guest port. envd, the e2b data plane of each sandbox
(``sandboxctl.envd``), is served under ``/v1/sandboxes/{id}/envd/`` with the same
root-or-sandbox auth, outside the body cap. Without a root token (development mode) nothing is
checked, and the CLI only allows a loopback listen address.

Every request body and answer is a shape of ``sandboxctl.agentapi``, the contract the
client reads with: bodies are read strictly (a bad field is a 400 naming it), answers are
written by ``core.wire``; the scaffolding is ``serving.apps``, as the API servers'.
"""

from __future__ import annotations

import hmac
import logging
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request, Response, params
from fastapi.exceptions import RequestValidationError
from msgspec import UNSET
from starlette.types import ASGIApp, Receive, Scope, Send

from sandboxctl.agentapi.models import (
    ClaimGrant,
    ClaimRequest,
    PoolsUpdate,
    RenewAnswer,
    RenewRequest,
    SandboxList,
    SandboxLog,
    SandboxRow,
    UsageSamples,
)
from sandboxctl.agentapi.network import NetworkUpdate
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.model import PoolKey
from sandboxctl.envd.app import PATH_PATTERN, create_envd_app
from sandboxctl.sandboxd.agent import Agent
from sandboxctl.sandboxd.envd_host import AgentSandboxes
from sandboxctl.sandboxd.errors import (
    AgentRefusal,
    BadRequest,
    NoSuchSandbox,
    Unauthorized,
)
from sandboxctl.sandboxd.guestports import PATH as PORTS_PATH
from sandboxctl.sandboxd.guestports import GuestPorts
from sandboxctl.sandboxd.metrics import SERVICE, AgentMetrics
from sandboxctl.sandboxd.runtime import SIZE_LIMITS, RuntimeFailure, Size
from sandboxctl.sandboxd.state import SandboxRecord
from sandboxctl.serving.apps import (
    BodyCap,
    HttpError,
    answer,
    body,
    install_error_handlers,
    json_app,
    no_content,
    refusal,
)
from sandboxctl.serving.metrics import CONTENT_TYPE, UNMATCHED, route_template, timed

MAX_BODY_BYTES = 1 << 20
RUNTIME_FAILED = "the sandbox runtime failed on this node (its log says why)"
ENVD_PATH = re.compile(PATH_PATTERN)
log = logging.getLogger("sandboxctl.sandboxd")
Dependencies = list[params.Depends]  # a route's ``dependencies=``: who may call it


class AgentAnswer(HttpError):
    """An error as the agent answers it: ``{"error": message}``."""

    def body(self) -> object:
        return {"error": self.message}


def create_app(agent: Agent, root_token: str | None, request_histograms: bool = True) -> FastAPI:
    metrics = AgentMetrics(agent.info, agent.usage, request_histograms)
    app = json_app("sandboxd")
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

    _add_sandbox_routes(app, agent, as_root, as_root_or_sandbox)
    _add_observing_routes(app, agent, metrics, as_root)

    install_error_handlers(
        app,
        translate=_answer,
        unmatched=lambda status, detail: AgentAnswer(status, detail.lower()),
    )
    # envd streams large bodies both ways: it bypasses the body cap
    envd = create_envd_app(AgentSandboxes(agent), may_act_on)
    app.state.envd = envd
    ports = GuestPorts(agent, may_act_on)
    # Outermost, so envd's and the guest ports' requests are counted and timed too.
    limited = BodyLimit(app, envd=envd, ports=ports)
    return timed(limited, metrics, SERVICE, _route_of)  # type: ignore[return-value]


def _add_sandbox_routes(
    app: FastAPI, agent: Agent, as_root: Dependencies, as_root_or_sandbox: Dependencies
) -> None:
    """The agent's sandboxes: read them, claim one, and what its holder may do to it."""

    @app.get("/v1/info", dependencies=as_root)
    def info() -> Response:
        return answer(agent.info())

    @app.get("/v1/sandboxes", dependencies=as_root)
    def list_sandboxes(claim_ref: str | None = None) -> Response:
        return answer(SandboxList(tuple(sandbox_row(r) for r in agent.sandboxes(claim_ref))))

    @app.get("/v1/sandboxes/{sandbox_id}", dependencies=as_root)
    def get_sandbox(sandbox_id: str) -> Response:
        return answer(sandbox_row(agent.get(sandbox_id), with_token=True))

    @app.post("/v1/claim", dependencies=as_root)
    def claim(request: ClaimBody) -> Response:
        record = agent.claim(request)
        grant = ClaimGrant(
            id=record.id,
            token=record.token,
            deadline=_time(record.deadline),
            owner_addr=agent.settings.advertise_addr,
            sandbox=sandbox_row(record),  # so the caller can show it before the next publish
        )
        return answer(grant)

    @app.post(
        "/v1/sandboxes/{sandbox_id}/release", status_code=204, dependencies=as_root_or_sandbox
    )
    def release(sandbox_id: str) -> Response:
        agent.release(sandbox_id)
        return no_content()

    @app.post("/v1/sandboxes/{sandbox_id}/renew", dependencies=as_root_or_sandbox)
    def renew(sandbox_id: str, request: RenewBody) -> Response:
        on_expire = None if request.on_expire is UNSET else request.on_expire  # "" is refused
        record = agent.renew(sandbox_id, request.ttl_seconds, on_expire)
        return answer(RenewAnswer(_time(record.deadline)))

    @app.post(
        "/v1/sandboxes/{sandbox_id}/hibernate", status_code=204, dependencies=as_root_or_sandbox
    )
    def hibernate(sandbox_id: str) -> Response:
        agent.hibernate(sandbox_id)
        return no_content()

    @app.post("/v1/sandboxes/{sandbox_id}/wake", status_code=204, dependencies=as_root_or_sandbox)
    def wake(sandbox_id: str) -> Response:
        agent.wake(sandbox_id)
        return no_content()


def _add_observing_routes(
    app: FastAPI, agent: Agent, metrics: AgentMetrics, as_root: Dependencies
) -> None:
    """What the agent saw: usage, logs and metrics; and the network and pool settings."""

    @app.get("/v1/sandboxes/{sandbox_id}/metrics", dependencies=as_root)
    def sandbox_usage(
        sandbox_id: str, start: float | None = None, end: float | None = None, latest: bool = False
    ) -> Response:
        agent.get(sandbox_id)  # 404 for an unknown or released sandbox
        samples = agent.usage.samples(sandbox_id, start, end)
        return answer(UsageSamples(tuple(samples[-1:] if latest else samples)))

    @app.get("/v1/sandboxes/{sandbox_id}/logs", dependencies=as_root)
    def sandbox_log(sandbox_id: str) -> Response:
        found = agent.events.events(sandbox_id)
        if found is None:
            raise NoSuchSandbox(f"sandbox {sandbox_id!r} not found")
        claim_ref, events = found
        return answer(SandboxLog(claim_ref=claim_ref, events=tuple(events)))

    @app.put("/v1/sandboxes/{sandbox_id}/network", status_code=204, dependencies=as_root)
    def set_network(sandbox_id: str, update: NetworkBody) -> Response:
        agent.set_network(sandbox_id, update)
        return no_content()

    @app.put("/v1/pools", dependencies=as_root)
    def put_pools(update: PoolsBody) -> Response:
        targets: dict[PoolKey, int] = {}
        for pool in update.pools:
            targets[pool.key] = targets.get(pool.key, 0) + pool.warm
        agent.set_pools(targets)
        return answer(agent.info())

    @app.get("/healthz", status_code=204)
    def healthz() -> Response:
        return no_content()  # open: it says only that the agent answers

    @app.get("/metrics", dependencies=as_root)
    def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)


def sandbox_row(record: SandboxRecord, with_token: bool = False) -> SandboxRow:
    # Never the claim's env: its values may be secrets, and every reader of the fleet
    # (the mesh inventory, the API servers) reads these rows.
    limits = SIZE_LIMITS[Size(record.size)]
    networked = bool(record.address)  # an agent without networks gives no address
    return SandboxRow(
        id=record.id,
        key=record.key,
        deadline=_time(record.deadline),
        claimed_at=_time(record.claimed_at),
        hibernated=record.hibernated,
        claim_ref=record.claim_ref,
        metadata=record.metadata,
        cpu_count=limits.cpu_count,
        mem_total_bytes=limits.memory_bytes,
        token=record.token if with_token else UNSET,
        network=record.network if networked else UNSET,
        address=record.address if networked else UNSET,
    )


def _json_only(media_type: str) -> None:
    if media_type and not (media_type.endswith("/json") or media_type.endswith("+json")):
        raise BadRequest("the body must be JSON (Content-Type: application/json)")


# Route parameters: the request body, read into its model before the route runs (JSON
# only; a bad field a 400 naming it: the models read request bodies strictly).
ClaimBody = Annotated[ClaimRequest, Depends(body(ClaimRequest, media_type=_json_only))]
RenewBody = Annotated[RenewRequest, Depends(body(RenewRequest, media_type=_json_only))]
PoolsBody = Annotated[PoolsUpdate, Depends(body(PoolsUpdate, media_type=_json_only))]
NetworkBody = Annotated[NetworkUpdate, Depends(body(NetworkUpdate, media_type=_json_only))]


def _time(timestamp: float | None) -> datetime | None:
    """A record's unix seconds as the one time type of every shape."""
    return None if timestamp is None else datetime.fromtimestamp(timestamp, UTC)


def _bearer(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _matches(offered: str, expected: str) -> bool:
    return bool(offered) and hmac.compare_digest(offered.encode(), expected.encode())


def status_of(error: Exception) -> int:
    """The status the agent's API answers an error with (the tree is drawn in
    ``sandboxctl.core.errors``): a refusal's own, 503 when the runtime could not serve
    it now (another node may), 400 for a value that does not parse, 500 for a bug."""
    if isinstance(error, AgentRefusal):
        return error.status
    if isinstance(error, RuntimeFailure):
        return 503
    if isinstance(error, InvalidValueError):
        return 400
    return 500


def _answer(request: Request, error: Exception) -> HttpError:
    """Any error as the agent answers it; a runtime failure and a bug are logged."""
    if isinstance(error, RuntimeFailure):
        # Its text names host paths and pids: the operator's log has it, a client
        # (whose tenant may be anyone's) gets what failed, not where.
        log.error("%s %s: %s", request.method, request.url.path, error)
        return AgentAnswer(503, RUNTIME_FAILED)
    if isinstance(error, RequestValidationError):
        return AgentAnswer(400, _validation_message(error.errors()))
    status = status_of(error)
    if status == 500:
        log.error("unexpected error", exc_info=error)
        return AgentAnswer(500, f"internal error: {type(error).__name__}")
    if isinstance(error, InvalidValueError):
        return AgentAnswer(status, refusal(error))
    return AgentAnswer(status, str(error))


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


PORTS_ROUTE = "/v1/sandboxes/{sandbox_id}/ports/{port}/{path}"


def _route_of(scope: Scope) -> str:
    """The route template of a request: the router's, or the guest ports' (no router)."""
    found = route_template(scope)
    if found == UNMATCHED and PORTS_PATH.match(scope["path"]):
        return PORTS_ROUTE
    return found


class BodyLimit:
    """Refuse request bodies over 1 MiB with 413, whether announced or streamed
    (``serving.BodyCap``), except envd's and the guest ports', which stream.

    The body is read here, up to the cap, and replayed to the app: every route takes a
    small JSON body, so buffering costs nothing and the app never sees a cut-off stream.
    """

    def __init__(
        self,
        app: ASGIApp,
        limit: int = MAX_BODY_BYTES,
        envd: ASGIApp | None = None,
        ports: ASGIApp | None = None,
    ) -> None:
        self.app = app
        self.limit = limit
        self.envd = envd
        self.ports = ports
        self.state = getattr(app, "state", None)
        self._capped = BodyCap(app, limit, _too_large)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and self.ports and PORTS_PATH.match(scope["path"]):
            await self.ports(scope, receive, send)  # a guest port's WebSocket upgrade
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.envd is not None and ENVD_PATH.match(scope["path"]):
            await self.envd(scope, receive, send)
            return
        if self.ports is not None and PORTS_PATH.match(scope["path"]):
            await self.ports(scope, receive, send)  # streamed both ways, like envd
            return
        await self._capped(scope, receive, send)


def _too_large(limit: int) -> HttpError:
    return AgentAnswer(413, f"request body over {limit} bytes")

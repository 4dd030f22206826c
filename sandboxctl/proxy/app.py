"""The envd proxy as an ASGI app: route, resolve, authorize, relay (streams both ways)."""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any, Final, NamedTuple

from prometheus_client import CollectorRegistry, Counter
from websockets.exceptions import InvalidHandshake

from sandboxctl.apiserver.e2b.models import envd_access_token, traffic_access_token
from sandboxctl.core.ids import SandboxId
from sandboxctl.proxy.budget import TokenBucket
from sandboxctl.proxy.guest import DirectGuests
from sandboxctl.proxy.routing import NO_SANDBOX, BadRoute, Target, is_internal, route
from sandboxctl.proxy.signature import BadSignature, FileSignature, file_signature
from sandboxctl.proxy.upstream import Upstream, UpstreamError, authority
from sandboxctl.relay import (
    CallerGone,
    Connection,
    Response,
    forward,
    guest_port_failure,
    leave_unfinished,
    open_websocket,
    passed_headers,
    quiet_cut_streams,
    raw_target,
    relay_websocket,
    request_head,
)
from sandboxctl.serving.metrics import CONTENT_TYPE, UNMATCHED, RequestTimes, timed
from sandboxctl.store import SandboxStore
from sandboxctl.store.owners import CAPACITY, Owner

log = logging.getLogger("sandboxctl.proxy")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

SERVICE: Final = "proxy"  # its requests' service label (``serving.metrics``)
ENVD_PORT: Final = 49983
JSON: Final = "application/json"
TRAFFIC_TOKEN: Final = "e2b-traffic-access-token"
CONNECT_TIMEOUT: Final = 5.0
OUTCOMES: Final = (
    "routed",
    "unknown",
    "unauthorized",
    "bad_request",
    "upstream_error",
    "internal_path",
)
# The proxy has no router: ``_http`` names the route it took in the scope, for the
# latency histogram (a sandbox's port is a route of its own, never its id or path).
ROUTE_LABEL: Final = "sandboxctl.proxy.route"
# The proxy's own routes, on its own host name only, and the methods each answers.
OWN_ROUTES: Final = {"/healthz": ("GET", "HEAD"), "/metrics": ("GET",)}
ENVD_ROUTE: Final = "envd"
GUEST_PORT_ROUTE: Final = "guest port"
# Never relayed upstream: the control-plane key, the caller's Host, the caller's
# Authorization (re-sent as X-Forwarded-Authorization: the agent's Authorization is the
# claim token), and Expect (uvicorn has already answered 100-continue to the caller);
# nor any X-Forwarded-* the caller made up (``_outbound_headers``).
DROPPED: Final = frozenset({b"host", b"x-api-key", b"authorization", b"expect"})


class ProxyMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "sandboxctl_envd_proxy_requests",
            "envd proxy requests by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.probes = Counter(
            "sandboxctl_envd_proxy_probes",
            "Probes of the fresh nodes for an id no inventory lists (within the budget)",
            registry=self.registry,
        )
        self.connections = Counter(
            "sandboxctl_envd_proxy_agent_connections",
            "Connections opened to agents (kept alive and reused between requests)",
            registry=self.registry,
        )
        for outcome in OUTCOMES:
            self.requests.labels(outcome)
        self.times = RequestTimes(self.registry)

    def count(self, outcome: str) -> None:
        self.requests.labels(outcome).inc()

    def render(self) -> bytes:
        """The registry in the Prometheus text format (``serving.metrics.CONTENT_TYPE``)."""
        return self.times.render()


class ProxyApp:
    def __init__(
        self,
        store: SandboxStore,
        envd_secret: bytes,
        domain: str,
        probe_rate: float = 200,
        probe_burst: float = 400,
    ) -> None:
        if not store.routes_claims:
            raise ValueError("the envd proxy needs a store with node access (NodeAccess)")
        self.store = store
        self.envd_secret = envd_secret
        self.domain = domain
        self.metrics = ProxyMetrics()
        self.budget = TokenBucket(probe_rate, probe_burst)
        self._upstream = Upstream(CONNECT_TIMEOUT, on_connect=self.metrics.connections.inc)
        self._guests = DirectGuests()
        quiet_cut_streams()
        self._timed = timed(self._http, self.metrics.times, SERVICE, _route_label)
        # One HMAC per claim token, not per request: the same bound as the owners kept.
        self._access_token = functools.lru_cache(maxsize=CAPACITY)(
            functools.partial(envd_access_token, envd_secret)
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._guest_websocket(scope, receive, send)
        elif scope["type"] == "http":
            await self._timed(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Route by the Host (or headers) to a sandbox's port: envd's, or a guest's."""
        headers = _headers(scope)
        try:
            target = route(headers, self.domain)
        except BadRoute as error:
            await self._bad_request(send, str(error))
            return
        if target is None:
            await self._no_sandbox(scope, send)
        elif target.port != ENVD_PORT:
            scope[ROUTE_LABEL] = GUEST_PORT_ROUTE
            await self._guest_port(scope, receive, send, headers, target)
        else:
            scope[ROUTE_LABEL] = ENVD_ROUTE
            await self._envd(scope, receive, send, headers, target)

    async def _no_sandbox(self, scope: Scope, send: Send) -> None:
        """A request that names no sandbox: the proxy's own routes, ``/healthz`` and
        ``/metrics`` (405 for another method), or a 400. A sandbox's host never gets
        here: its ``/healthz`` and ``/metrics`` are its guest's own."""
        path, method = scope["path"], scope["method"]
        allowed = OWN_ROUTES.get(path)
        if allowed is None:
            await self._bad_request(send, NO_SANDBOX)
            return
        scope[ROUTE_LABEL] = path
        if method not in allowed:
            self.metrics.count("bad_request")
            message = f"{path} answers {' and '.join(allowed)} only"
            extra = [(b"allow", ", ".join(allowed).encode())]
            payload = json.dumps({"code": 405, "message": message}).encode()
            await _reply_bytes(send, 405, payload, JSON, extra)
        elif path == "/metrics":
            await _reply_bytes(send, 200, self.metrics.render(), CONTENT_TYPE)
        else:
            await _reply(send, 204, None)

    async def _envd(
        self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str], target: Target
    ) -> None:
        """envd's port: its internal paths are never relayed; every other path but its
        health needs the sandbox's envd access token, or a signed file URL."""
        path, method = scope["path"], scope["method"]
        if is_internal(path):
            self.metrics.count("internal_path")
            await _reply(send, 404, {"code": 404, "message": "not found"})
            return
        presented = headers.get("x-access-token", "")
        open_path = method in ("GET", "HEAD") and path.rstrip("/") == "/health"
        signed = None
        if not presented and not open_path:
            try:
                signed = file_signature(method, path, scope.get("query_string") or b"")
            except BadSignature as error:
                await self._bad_request(send, str(error))
                return
            if signed is None:
                await self._unauthorized(send, "missing X-Access-Token")
                return
        owner = await self._owner(target)
        if owner is None:
            self.metrics.count("unknown")
            await _not_found(send, target)
            return
        problem = None if open_path else self._access_problem(owner, presented, signed)
        if problem is not None:
            await self._unauthorized(send, problem)
            return
        await self._relay(scope, receive, send, headers, target, owner)

    def _access_problem(
        self, owner: Owner, presented: str, signed: FileSignature | None
    ) -> str | None:
        """Why the caller may not reach this sandbox's envd, or None."""
        expected = self._access_token(owner.token)
        if signed is not None:
            return signed.problem(expected, time.time())
        if not hmac.compare_digest(presented.encode(), expected.encode()):
            return "X-Access-Token does not match the sandbox"
        return None

    async def _owner(self, target: Target) -> Owner | None:
        """The node holding the sandbox: remembered, else from the inventory or a probe
        within the budget, which may wait on nodes (off the loop)."""
        sandbox_id = SandboxId.parse(target.sandbox_id)
        owner = self.store.cached_owner(sandbox_id)
        if owner is None:
            owner = await asyncio.to_thread(self.store.owner, sandbox_id, self._may_probe)
        return owner

    def _may_probe(self) -> bool:
        """Whether an id no inventory lists may be looked for on every node: the
        per-replica token bucket bounds what unknown ids cost the fleet."""
        if not self.budget.take():
            return False
        self.metrics.probes.inc()
        return True

    async def _bad_request(self, send: Send, message: str) -> None:
        self.metrics.count("bad_request")
        await _reply(send, 400, {"code": 400, "message": message})

    async def _unauthorized(self, send: Send, message: str) -> None:
        self.metrics.count("unauthorized")
        await _unauthorized(send, message)

    async def _guest_port(
        self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str], target: Target
    ) -> None:
        """Any other port: straight to the sandbox when this proxy runs beside its agent
        and the server listens on the sandbox's address (``guest.py``), else relayed to
        the owning agent's guest-port route, which connects inside the sandbox. No envd
        token; a sandbox created with allowPublicTraffic false requires its traffic
        access token (E2B-Traffic-Access-Token)."""
        owner = await self._owner(target)
        if owner is None:
            self.metrics.count("unknown")
            await _not_found(send, target)
            return
        if not self._traffic_allowed(owner, headers):
            await self._unauthorized(send, f"this sandbox's ports need its {TRAFFIC_TOKEN}")
            return
        direct = await self._guests.connect(owner.claim_id, owner.sandbox_address, target.port)
        if direct is not None:
            await self._relay(scope, receive, send, headers, target, owner, guest=direct)
            return
        prefix = f"/v1/sandboxes/{owner.claim_id}/ports/{target.port}"
        await self._relay(scope, receive, send, headers, target, owner, prefix)

    async def _guest_websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket upgrade to a guest port: resolved and authorized as a guest-port
        request, then relayed message by message through the agent's guest-port route.
        A refusal closes it before it is accepted (the caller sees 403)."""
        headers = _headers(scope)
        try:
            target = route(headers, self.domain)
        except BadRoute:
            target = None
        if target is None or target.port == ENVD_PORT:
            self.metrics.count("bad_request")
            await send({"type": "websocket.close", "code": 1008})
            return
        owner = await self._owner(target)
        if owner is None or not self._traffic_allowed(owner, headers):
            self.metrics.count("unknown" if owner is None else "unauthorized")
            await send({"type": "websocket.close", "code": 1008})
            return
        path = raw_target(scope).decode("latin-1")
        sock = await self._guests.open_socket(owner.claim_id, owner.sandbox_address, target.port)
        if sock is not None:  # straight to the guest, asked as the agent would ask it
            uri = f"ws://localhost:{target.port}{path}"
            sent: list[tuple[str, str]] = []
        else:
            scheme = "wss" if owner.address.startswith("https://") else "ws"
            uri = (
                f"{scheme}://{authority(owner.address)}/v1/sandboxes/{owner.claim_id}"
                f"/ports/{target.port}{path}"
            )
            sent = [("authorization", f"Bearer {owner.token}")]
        await receive()  # websocket.connect
        try:
            upstream = await open_websocket(
                uri, sock=sock, headers=sent, subprotocols=scope.get("subprotocols", ())
            )
        except (OSError, InvalidHandshake, TimeoutError) as error:
            if sock is not None:
                sock.close()
            self.metrics.count("upstream_error")
            log.info("WebSocket relay for %s failed: %s", target.sandbox_id, error)
            await send({"type": "websocket.close", "code": 1011})
            return
        self.metrics.count("routed")
        await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
        await relay_websocket(receive, send, upstream)

    def _traffic_allowed(self, owner: Owner, headers: dict[str, str]) -> bool:
        """A public sandbox's ports are open; a private one's need its traffic token."""
        if owner.public_traffic:
            return True
        presented = headers.get(TRAFFIC_TOKEN, "")
        expected = traffic_access_token(self.envd_secret, owner.token)
        return hmac.compare_digest(presented.encode(), expected.encode())

    async def _relay(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        headers: dict[str, str],
        target: Target,
        owner: Owner,
        prefix: str | None = None,
        guest: Connection | None = None,
    ) -> None:
        """Relay to the owning agent under ``prefix`` (envd's by default), or over
        ``guest`` (a connection of the direct guests' pool) straight to a guest port.
        The response is checked and passed on by ``relay`` (one final response, its
        framing the relay's own check); a guest port's answers are otherwise the
        guest's own."""
        has_body = "content-length" in headers or "transfer-encoding" in headers
        request = self._outbound(scope, headers, target, owner, prefix, guest)
        caller = _Caller(receive, send, has_body)
        watcher = asyncio.create_task(caller.watch())
        try:
            try:
                await self._exchange(request, caller, target, guest, has_body)
            except (UpstreamError, CallerGone) as error:
                await self._failed(error, caller, target, owner, guest)
        except asyncio.CancelledError:
            if not caller.hung_up.is_set():
                raise
            caller.uncancel()  # the caller hung up: end quietly, the relay is closed
            if not caller.started:
                self.metrics.count("upstream_error")
        finally:
            watcher.cancel()

    def _outbound(
        self,
        scope: Scope,
        headers: dict[str, str],
        target: Target,
        owner: Owner,
        prefix: str | None,
        guest: Connection | None,
    ) -> _Outbound:
        """Where the request goes and its head: straight to the guest (its own Host, no
        claim token), or to the agent's route under ``prefix``."""
        if guest is not None:
            host = headers.get("host") or f"localhost:{target.port}"
            head, chunked = _request_head(scope, headers, owner, "", host, claim_token=False)
            return _Outbound(self._guests.pool, guest.key, guest, head, chunked)
        if prefix is None:
            prefix = f"/v1/sandboxes/{owner.claim_id}/envd"
        head, chunked = _request_head(scope, headers, owner, prefix, authority(owner.address))
        return _Outbound(self._upstream, owner.address, None, head, chunked)

    async def _exchange(
        self,
        request: _Outbound,
        caller: _Caller,
        target: Target,
        guest: Connection | None,
        has_body: bool,
    ) -> None:
        async with request.pool.exchange(
            request.address,
            request.head,
            caller.body() if has_body else None,
            chunked=request.chunked,
            connection=request.connection,
        ) as upstream:
            if upstream.status == 401 and guest is None:
                # The node refused the claim token it gave us: the claim is gone
                # (released since its owner was remembered). Answer as for an unknown id, so
                # the SDK says "not running", and resolve afresh next time.
                self.store.forget(SandboxId.parse(target.sandbox_id))
                self.metrics.count("unknown")
                await _not_found(caller.reply, target)
                return
            if guest is None and upstream.status in (404, 502) and _is_json(upstream):
                self.store.forget(SandboxId.parse(target.sandbox_id))  # maybe a stale owner
            self.metrics.count("routed")
            caller.started = True  # forward sends the head before it can fail
            await forward(upstream, caller.reply)

    async def _failed(
        self,
        error: UpstreamError | CallerGone,
        caller: _Caller,
        target: Target,
        owner: Owner,
        guest: Connection | None,
    ) -> None:
        relay = "envd relay" if target.port == ENVD_PORT else f"guest port {target.port} relay"
        via = "straight" if guest is not None else f"through {owner.node}"
        if caller.started:
            # The response stays unfinished: the server then drops the connection,
            # so the caller sees a cut stream, never a complete-looking short one.
            log.info("%s for %s (%s) broke off: %s", relay, target.sandbox_id, via, error)
            leave_unfinished()
            return
        self.metrics.count("upstream_error")
        log.info("%s for %s (%s) failed: %s", relay, target.sandbox_id, via, error)
        if guest is not None and isinstance(error, UpstreamError):
            # The guest's own server answered badly: say so, as the agent would.
            text = guest_port_failure(target.sandbox_id, target.port, error)
            await _reply_bytes(caller.reply, 502, json.dumps({"error": text}).encode(), JSON)
            return
        self.store.forget(SandboxId.parse(target.sandbox_id))
        await _not_found(caller.reply, target)


class _Outbound(NamedTuple):
    """Where a relayed request goes, and its head."""

    pool: Upstream
    address: str
    connection: Connection | None
    head: bytes
    chunked: bool


class _Caller:
    """The caller's side of one relayed exchange: its body as the relay reads it, the
    response as it is sent, and its hang-up, which cancels the relay unless the
    response's last part is on its way (the clean-up must run)."""

    def __init__(self, receive: Receive, send: Send, has_body: bool) -> None:
        self._receive = receive
        self._send = send
        self._task = asyncio.current_task()
        self.body_done = asyncio.Event()
        if not has_body:
            self.body_done.set()  # nothing to read: watch for the hang-up at once
        self.hung_up = asyncio.Event()
        self.finishing = False
        self.started = False  # the response is being relayed

    async def body(self) -> AsyncIterator[bytes]:
        try:
            while True:
                message = await self._receive()
                if message["type"] == "http.disconnect":
                    raise CallerGone
                chunk = message.get("body", b"")
                if chunk:
                    yield chunk
                if not message.get("more_body", False):
                    return
        finally:
            self.body_done.set()

    async def reply(self, message: Message) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body"):
            self.finishing = True  # from here a hang-up must not cancel the clean-up
        await self._send(message)

    async def watch(self) -> None:
        await self.body_done.wait()
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                if not self.finishing:
                    self.hung_up.set()
                    if self._task is not None:
                        self._task.cancel()
                return

    def uncancel(self) -> None:
        if self._task is not None:
            self._task.uncancel()


def create_proxy_app(
    store: SandboxStore,
    envd_secret: bytes,
    domain: str,
    probe_rate: float = 200,
    probe_burst: float = 400,
) -> ProxyApp:
    """The envd proxy over ``store`` (which must have node access): an ASGI app."""
    return ProxyApp(store, envd_secret, domain, probe_rate, probe_burst)


def _route_label(scope: Scope) -> str:
    """What ``_http`` chose for a request, as the latency histogram's ``route``."""
    return str(scope.get(ROUTE_LABEL, UNMATCHED))


def _headers(scope: Scope) -> dict[str, str]:
    found: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", ()):
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        found[name] = f"{found[name]}, {value}" if name in found else value
    return found


def _request_head(
    scope: Scope,
    headers: dict[str, str],
    owner: Owner,
    prefix: str,
    host: str,
    claim_token: bool = True,
) -> tuple[bytes, bool]:
    """The request line and headers for the agent: the sandbox's route on the node
    (``prefix``: envd's or a guest port's) and the caller's target, the caller's headers
    less hop-by-hop and control-plane ones, the claim token; for a guest port reached
    straight, no prefix, the caller's Host and no claim token (what the agent's relay
    would send it). Also whether the body is chunked."""
    raw = scope.get("headers", ())
    outbound = _outbound_headers(scope, headers, owner, claim_token)
    target = prefix.encode("latin-1") + raw_target(scope)
    return request_head(scope["method"], target, host.encode("latin-1"), outbound, raw)


def _outbound_headers(
    scope: Scope, headers: dict[str, str], owner: Owner, claim_token: bool = True
) -> list[tuple[bytes, bytes]]:
    out = [
        (name, value)
        for name, value in passed_headers(scope.get("headers", ()), DROPPED)
        if not name.lower().startswith(b"x-forwarded-")
    ]
    if "authorization" in headers:
        out.append((b"x-forwarded-authorization", headers["authorization"].encode("latin-1")))
    client = scope.get("client")
    if client:
        out.append((b"x-forwarded-for", str(client[0]).encode("latin-1")))
    if "host" in headers:
        out.append((b"x-forwarded-host", headers["host"].encode("latin-1")))
    out.append((b"x-forwarded-proto", str(scope.get("scheme", "http")).encode("latin-1")))
    if claim_token:
        out.append((b"authorization", f"Bearer {owner.token}".encode("latin-1")))
    return out


def _is_json(response: Response) -> bool:
    return any(
        name.lower() == b"content-type" and value.startswith(b"application/json")
        for name, value in response.headers
    )


async def _not_found(send: Send, target: Target) -> None:
    """The one 502 for unknown ids, unreachable nodes and unserved ports: it names no
    node, and the e2b SDK maps it to SandboxNotRunningException."""
    body = {"code": 502, "message": f"The sandbox {target.sandbox_id} was not found"}
    await _reply(send, 502, body)


async def _unauthorized(send: Send, message: str) -> None:
    await _reply(send, 401, {"code": 401, "message": f"unauthorized access: {message}"})


async def _reply(send: Send, status: int, body: dict[str, Any] | None) -> None:
    if body is None:
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    await _reply_bytes(
        send, status, json.dumps(body, separators=(",", ":")).encode(), "application/json"
    )


async def _reply_bytes(
    send: Send,
    status: int,
    payload: bytes,
    content_type: str,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(payload)).encode()),
        *(extra or ()),
    ]
    if status in (429, 502, 503, 504):
        headers.append((b"should-retry", b"false"))  # the SDK would retry 3 times otherwise
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})

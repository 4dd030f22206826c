"""The envd proxy as an ASGI app: route, resolve, authorize, relay (streams both ways)."""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from websockets.exceptions import InvalidHandshake

from sandboxctl.apiserver.e2b.models import envd_access_token, traffic_access_token
from sandboxctl.proxy.budget import TokenBucket
from sandboxctl.proxy.guest import DirectGuests
from sandboxctl.proxy.resolve import CACHE_CAPACITY, Owner, OwnerCache, Resolver
from sandboxctl.proxy.routing import NO_SANDBOX, BadRoute, Target, is_internal, route
from sandboxctl.proxy.signature import BadSignature, file_signature
from sandboxctl.proxy.upstream import Upstream, UpstreamError, authority
from sandboxctl.relay import (
    CallerGone,
    Connection,
    Response,
    forward,
    guest_port_failure,
    open_websocket,
    passed_headers,
    raw_target,
    relay_websocket,
    request_head,
)
from sandboxctl.store import SandboxStore

log = logging.getLogger("sandboxctl.proxy")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

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

    def count(self, outcome: str) -> None:
        self.requests.labels(outcome).inc()


class ProxyApp:
    def __init__(
        self,
        store: SandboxStore,
        envd_secret: bytes,
        domain: str,
        probe_rate: float = 200,
        probe_burst: float = 400,
        owner_ttl: float = 60.0,
    ) -> None:
        self.envd_secret = envd_secret
        self.domain = domain
        self.metrics = ProxyMetrics()
        self.budget = TokenBucket(probe_rate, probe_burst)
        self.resolver = Resolver(
            store, self.budget, OwnerCache(owner_ttl), on_probe=self.metrics.probes.inc
        )
        self._upstream = Upstream(CONNECT_TIMEOUT, on_connect=self.metrics.connections.inc)
        self._guests = DirectGuests()
        # One HMAC per claim token, not per request: the same bound as the owner cache.
        self._access_token = functools.lru_cache(maxsize=CACHE_CAPACITY)(
            functools.partial(envd_access_token, envd_secret)
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._guest_websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        method: str = scope["method"]
        headers = _headers(scope)
        if path == "/healthz" and method in ("GET", "HEAD"):
            await _reply(send, 204, None)
            return
        try:
            target = route(headers, self.domain)
        except BadRoute as error:
            self.metrics.count("bad_request")
            await _reply(send, 400, {"code": 400, "message": str(error)})
            return
        if target is None:
            if path == "/metrics" and method == "GET":
                await _reply_bytes(
                    send, 200, generate_latest(self.metrics.registry), CONTENT_TYPE_LATEST
                )
                return
            self.metrics.count("bad_request")
            await _reply(send, 400, {"code": 400, "message": NO_SANDBOX})
            return
        if target.port != ENVD_PORT:
            await self._guest_port(scope, receive, send, headers, target)
            return
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
                self.metrics.count("bad_request")
                await _reply(send, 400, {"code": 400, "message": str(error)})
                return
            if signed is None:
                self.metrics.count("unauthorized")
                await _unauthorized(send, "missing X-Access-Token")
                return
        owner = self.resolver.cached(target.sandbox_id)
        if owner is None:  # the inventory or a probe: may wait on nodes, off the loop
            owner = await asyncio.to_thread(self.resolver.resolve, target.sandbox_id)
        if owner is None:
            self.metrics.count("unknown")
            await _not_found(send, target)
            return
        if not open_path:
            expected = self._access_token(owner.token)
            if signed is not None:
                problem = signed.problem(expected, time.time())
            elif not hmac.compare_digest(presented.encode(), expected.encode()):
                problem = "X-Access-Token does not match the sandbox"
            else:
                problem = None
            if problem is not None:
                self.metrics.count("unauthorized")
                await _unauthorized(send, problem)
                return
        await self._relay(scope, receive, send, headers, target, owner)

    async def _guest_port(
        self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str], target: Target
    ) -> None:
        """Any other port: straight to the sandbox when this proxy runs beside its agent
        and the server listens on the sandbox's address (``guest.py``), else relayed to
        the owning agent's guest-port route, which connects inside the sandbox. No envd
        token; a sandbox created with allowPublicTraffic false requires its traffic
        access token (E2B-Traffic-Access-Token)."""
        owner = self.resolver.cached(target.sandbox_id)
        if owner is None:
            owner = await asyncio.to_thread(self.resolver.resolve, target.sandbox_id)
        if owner is None:
            self.metrics.count("unknown")
            await _not_found(send, target)
            return
        if not self._traffic_allowed(owner, headers):
            self.metrics.count("unauthorized")
            await _unauthorized(send, f"this sandbox's ports need its {TRAFFIC_TOKEN}")
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
        owner = self.resolver.cached(target.sandbox_id)
        if owner is None:
            owner = await asyncio.to_thread(self.resolver.resolve, target.sandbox_id)
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
        if guest is not None:
            pool, address, connection = self._guests.pool, guest.key, guest
            host = headers.get("host") or f"localhost:{target.port}"
            head, chunked = _request_head(scope, headers, owner, "", host, claim_token=False)
        else:
            pool, address, connection = self._upstream, owner.address, None
            if prefix is None:
                prefix = f"/v1/sandboxes/{owner.claim_id}/envd"
            host = authority(owner.address)
            head, chunked = _request_head(scope, headers, owner, prefix, host)
        body_done = asyncio.Event()

        async def body() -> AsyncIterator[bytes]:
            try:
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise CallerGone
                    chunk = message.get("body", b"")
                    if chunk:
                        yield chunk
                    if not message.get("more_body", False):
                        return
            finally:
                body_done.set()

        if not has_body:
            body_done.set()  # nothing to read: watch for the hang-up at once
        task = asyncio.current_task()
        hung_up = asyncio.Event()
        finishing = False

        async def reply(message: Message) -> None:
            nonlocal finishing
            if message["type"] == "http.response.body" and not message.get("more_body"):
                finishing = True  # from here a hang-up must not cancel the clean-up
            await send(message)

        async def watch() -> None:
            await body_done.wait()
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    if not finishing:
                        hung_up.set()
                        if task is not None:
                            task.cancel()
                    return

        watcher = asyncio.create_task(watch())
        started = False
        relay = "envd relay" if target.port == ENVD_PORT else f"guest port {target.port} relay"
        via = "straight" if guest is not None else f"through {owner.node}"
        try:
            try:
                async with pool.exchange(
                    address,
                    head,
                    body() if has_body else None,
                    chunked=chunked,
                    connection=connection,
                ) as upstream:
                    if upstream.status == 401 and guest is None:
                        # The node refused the claim token it gave us: the claim is gone
                        # (released since it was cached). Answer as for an unknown id, so
                        # the SDK says "not running", and resolve afresh next time.
                        self.resolver.forget(target.sandbox_id)
                        self.metrics.count("unknown")
                        await _not_found(reply, target)
                        return
                    if guest is None and upstream.status in (404, 502) and _is_json(upstream):
                        self.resolver.forget(target.sandbox_id)  # maybe a stale owner
                    self.metrics.count("routed")
                    started = True  # forward sends the head before it can fail
                    await forward(upstream, reply)
            except (UpstreamError, CallerGone) as error:
                if started:
                    # The response stays unfinished: the server then drops the connection,
                    # so the caller sees a cut stream, never a complete-looking short one.
                    log.info("%s for %s (%s) broke off: %s", relay, target.sandbox_id, via, error)
                    return
                self.metrics.count("upstream_error")
                log.info("%s for %s (%s) failed: %s", relay, target.sandbox_id, via, error)
                if guest is not None and isinstance(error, UpstreamError):
                    # The guest's own server answered badly: say so, as the agent would.
                    text = guest_port_failure(target.port, error)
                    await _reply_bytes(reply, 502, json.dumps({"error": text}).encode(), JSON)
                    return
                self.resolver.forget(target.sandbox_id)
                await _not_found(reply, target)
        except asyncio.CancelledError:
            if not hung_up.is_set():
                raise
            if task is not None:
                task.uncancel()  # the caller hung up: end quietly, the relay is closed
            if not started:
                self.metrics.count("upstream_error")
        finally:
            watcher.cancel()


def create_proxy_app(
    store: SandboxStore,
    envd_secret: bytes,
    domain: str,
    probe_rate: float = 200,
    probe_burst: float = 400,
    owner_ttl: float = 60.0,
) -> ProxyApp:
    """The envd proxy over ``store`` (which must have node access): an ASGI app."""
    return ProxyApp(store, envd_secret, domain, probe_rate, probe_burst, owner_ttl)


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


async def _reply_bytes(send: Send, status: int, payload: bytes, content_type: str) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(payload)).encode()),
    ]
    if status in (429, 502, 503, 504):
        headers.append((b"should-retry", b"false"))  # the SDK would retry 3 times otherwise
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})

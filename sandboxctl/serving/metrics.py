"""Request latency on every HTTP service, in one shape: a Prometheus histogram
``sandboxctl_http_request_duration_seconds`` by ``service``, ``route``, ``method`` and
``status``, which :class:`Timed` (plain ASGI, around the whole app) fills. Every app
factory times its requests through :func:`timed` with its service's ``SERVICE`` name; a
process whose apps serve no ``/metrics`` of their own serves theirs on a
:class:`MetricsListener`.

``route`` is the route template the router matched (``/sandboxes/{sandboxID}``), never
the path a client sent: an id in a label would make a series per sandbox. A request no
route matched is :data:`UNMATCHED`, a method outside HTTP's own is :data:`OTHER_METHOD`,
and a status outside the registered ones is :data:`OTHER_STATUS` (a guest port answers
with whatever status its server picks), so what a client or a guest sends cannot add
series. The time runs from the request's arrival at
the app to the answer's last byte (a streamed answer counts whole).
"""

from __future__ import annotations

import contextlib
import http
import logging
import socket
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar, cast

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandboxctl.serving import Served, Tls, bind
from sandboxctl.serving.bounds import ReadBounds

NAME: Final = "sandboxctl_http_request_duration_seconds"
LABELS: Final = ("service", "route", "method", "status")
# From 0.5 ms (a warm claim's own work) to 30 s (a create that waits for a cold start).
BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
UNMATCHED: Final = "unmatched"
OTHER_METHOD: Final = "other"
OTHER_STATUS: Final = "other"
STATUSES: Final = frozenset(int(status) for status in http.HTTPStatus)
NO_ANSWER: Final = "none"  # the client left, or the app failed, before an answer began
METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# What generate_latest writes for these names (the classic text format), whichever
# version of prometheus_client names as its latest; every /metrics of sandboxctl says it.
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

Observe = Callable[[str, str, str, float], None]  # route, method, status, seconds
RouteOf = Callable[[Scope], str]
App = TypeVar("App")


class Timings(Protocol):
    """Where a service's requests are observed: :class:`RequestTimes`, or a service's own
    metrics that also count them (sandboxd's)."""

    def of(self, service: str) -> Observe: ...


class RequestTimes:
    """The request histogram of one registry. Services served by one process may share
    it (their series differ by ``service``); each observes through :meth:`of`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._histogram = Histogram(
            NAME,
            "HTTP request latency, from arrival to the answer's last byte, by service, "
            "route template, method and status.",
            LABELS,
            buckets=BUCKETS,
            registry=self.registry,
        )
        # One child per label set, found by a dict lookup: labels() takes a lock and
        # checks its arguments on every call.
        self._children: dict[tuple[str, str, str, str], Any] = {}

    def of(self, service: str) -> Observe:
        """The observer of one service's requests."""

        def observe(route: str, method: str, status: str, seconds: float) -> None:
            key = (service, route, method, status)
            child = self._children.get(key)
            if child is None:
                child = self._children.setdefault(key, self._histogram.labels(*key))
            child.observe(seconds)

        return observe

    def render(self) -> bytes:
        """The registry in the Prometheus text format (:data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)


def route_template(scope: Scope) -> str:
    """The template of the route the router matched (Starlette and FastAPI put it in the
    scope), or :data:`UNMATCHED`."""
    return str(getattr(scope.get("route"), "path", UNMATCHED))


def method_label(method: str) -> str:
    return method if method in METHODS else OTHER_METHOD


def status_label(status: int) -> str:
    if not status:
        return NO_ANSWER
    return str(status) if status in STATUSES else OTHER_STATUS


class Timed:
    """ASGI middleware: time each HTTP request and hand it to ``observe`` with its
    route (``route_of``, read once the app has answered: the router sets it on the way
    in), method and status. Plain ASGI, no task or stream of its own, so it costs a
    request a clock read, a dict lookup and a bucket increment. Other scopes (WebSocket,
    lifespan) pass untimed: a session's length is not a latency."""

    def __init__(self, app: ASGIApp, observe: Observe, route_of: RouteOf = route_template):
        self.app = app
        self.observe = observe
        self.route_of = route_of

    def __getattr__(self, name: str) -> Any:
        # Anything but a request is the wrapped app's (its state, its routes), so a timed
        # app reads as the app its factory built.
        if name == "app":  # not set yet: no wrapped app to ask
            raise AttributeError(name)
        return getattr(self.app, name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.observe(
                self.route_of(scope),
                method_label(scope["method"]),
                status_label(status),
                time.perf_counter() - started,
            )


def timed(app: App, times: Timings | None, service: str, route_of: RouteOf = route_template) -> App:
    """``app`` with its requests timed into ``times`` as ``service``; as it is without.
    Around the whole app, outside Starlette's own error middleware, so a bug's 500 is
    timed as a 500. Every app factory calls it last."""
    if times is None:
        return app
    return cast(App, Timed(cast(ASGIApp, app), times.of(service), route_of))


def metrics_app(times: RequestTimes) -> ASGIApp:
    """An app of its own for a metrics listener: ``GET /metrics`` is the registry of
    ``times``, ``GET /healthz`` answers 204; another method on either is 405 (``Allow:
    GET``), any other path 404, each with a JSON body."""
    text = [(b"content-type", CONTENT_TYPE.encode())]
    json = [(b"content-type", b"application/json")]
    not_served = b'{"error": "only GET /metrics and GET /healthz are served here"}'
    only_get = b'{"error": "only GET is served on this path"}'

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path not in ("/metrics", "/healthz"):
            status, headers, payload = 404, json, not_served
        elif scope["method"] != "GET":
            status, headers, payload = 405, [*json, (b"allow", b"GET")], only_get
        elif path == "/metrics":
            status, headers, payload = 200, text, times.render()
        else:
            status, headers, payload = 204, [], b""
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    return app


@dataclass
class MetricsListener:
    """A plain-HTTP listener of its own for the request histograms of the APIs a process
    serves that have no ``/metrics`` of their own (a tenant's key must not read the
    fleet's figures): its address, checked before anything binds, then its socket and the
    histograms the APIs fill; nothing of it without an address."""

    address: tuple[str, int] | None
    times: RequestTimes | None = None
    sock: socket.socket | None = None

    @classmethod
    def on(cls, sock: socket.socket) -> MetricsListener:
        """A listener on a socket already bound (``serve`` binds every port first)."""
        return cls(sock.getsockname()[:2], RequestTimes(), sock)

    def bind(self, running: contextlib.ExitStack) -> RequestTimes | None:
        """Listen now (a taken port fails before anything serves); the histograms."""
        if self.address is not None and self.sock is None:
            self.sock = running.enter_context(bind(*self.address))
            self.times = RequestTimes()
        return self.times

    def served(
        self,
        apis: Sequence[tuple[Any, socket.socket]],
        tls: Tls | None,
        bounds: ReadBounds,
        tls_only: Collection[socket.socket] | None = None,
        log: logging.Logger | None = None,
    ) -> Served:
        """The APIs' listeners (HTTPS with ``tls``, on ``tls_only``, default every one of
        theirs) and this one's, plain HTTP (its URL logged to ``log``)."""
        listeners = list(apis)
        if self.times is not None and self.sock is not None:
            listeners.append((metrics_app(self.times), self.sock))
            if log is not None:
                host, port = self.sock.getsockname()[:2]
                host = f"[{host}]" if ":" in host else host
                log.info("serving /metrics on http://%s:%d/metrics", host, port)
        only = [sock for _, sock in apis] if tls_only is None else list(tls_only)
        return Served(listeners, tls=tls, tls_only=only, bounds=bounds)

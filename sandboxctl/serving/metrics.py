"""Request latency on every HTTP service, in one shape: a Prometheus histogram
``sandboxctl_http_request_duration_seconds`` by ``service``, ``route``, ``method`` and
``status``, which :class:`Timed` (plain ASGI, around the whole app) fills.

``route`` is the route template the router matched (``/sandboxes/{sandboxID}``), never
the path a client sent: an id in a label would make a series per sandbox. A request no
route matched is :data:`UNMATCHED`, a method outside HTTP's own is :data:`OTHER_METHOD`,
so what a client sends cannot add series. The time runs from the request's arrival at
the app to the answer's last byte (a streamed answer counts whole).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

NAME: Final = "sandboxctl_http_request_duration_seconds"
LABELS: Final = ("service", "route", "method", "status")
# From 0.5 ms (a warm claim's own work) to 30 s (a create that waits for a cold start).
BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
UNMATCHED: Final = "unmatched"
OTHER_METHOD: Final = "other"
NO_ANSWER: Final = "none"  # the client left, or the app failed, before an answer began
METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
CONTENT_TYPE: Final = CONTENT_TYPE_LATEST

Observe = Callable[[str, str, str, float], None]  # route, method, status, seconds
RouteOf = Callable[[Scope], str]


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
        self.state = getattr(app, "state", None)  # what callers read from the app it wraps

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
                str(status) if status else NO_ANSWER,
                time.perf_counter() - started,
            )


def timed(app: ASGIApp, times: RequestTimes | None, service: str) -> ASGIApp:
    """``app`` with its requests timed into ``times`` as ``service``; as it is without."""
    return app if times is None else Timed(app, times.of(service))


def metrics_app(times: RequestTimes) -> ASGIApp:
    """An app of its own for a metrics listener: ``GET /metrics`` is the registry of
    ``times``, ``GET /healthz`` answers 204, anything else 404 with a JSON body."""
    text = [(b"content-type", CONTENT_TYPE.encode())]
    json = [(b"content-type", b"application/json")]
    not_served = b'{"error": "only GET /metrics and GET /healthz are served here"}'

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        route = (scope["method"], scope["path"])
        if route == ("GET", "/metrics"):
            status, headers, payload = 200, text, times.render()
        elif route == ("GET", "/healthz"):
            status, headers, payload = 204, [], b""
        else:
            status, headers, payload = 404, json, not_served
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    return app

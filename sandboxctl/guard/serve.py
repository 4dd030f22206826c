"""The running guard's own HTTP: ``/metrics`` (Prometheus), ``/status`` (the
``GuardStatus`` JSON) and ``/healthz`` (200 once the caches synced, else 503), served on a
thread of its own with every listener's read bounds (``sandboxctl.serving``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sandboxctl.serving import InBackground, bind
from sandboxctl.serving.bounds import ReadBounds


class GuardHttp:
    def __init__(
        self,
        registry: CollectorRegistry,
        status: Callable[[], dict[str, Any]],
        healthy: Callable[[], bool],
    ) -> None:
        self._registry = registry
        self._status = status
        self._healthy = healthy
        self._server: InBackground | None = None

    def serve(self, host: str, port: int, bounds: ReadBounds | None = None) -> int:
        """Serve on a thread; the bound port (one line and exit 2 when it cannot listen).
        ``bounds``: how the listener reads requests (default: every listener's)."""
        self._server = InBackground(self._app, bind(host, port), bounds)
        return self._server.port

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await self._answer(scope["method"], scope["path"])(scope, receive, send)

    def _answer(self, method: str, path: str) -> Response:
        if method not in ("GET", "HEAD"):
            return _text(405, b"only GET\n")
        if path == "/metrics":
            return Response(generate_latest(self._registry), 200, media_type=CONTENT_TYPE_LATEST)
        if path == "/status":
            body = json.dumps(self._status(), indent=2).encode()
            return Response(body, 200, media_type="application/json")
        if path == "/healthz":
            ok = self._healthy()
            return _text(200 if ok else 503, b"ok\n" if ok else b"syncing\n")
        return _text(404, b"not found\n")


def _text(status: int, body: bytes) -> Response:
    return Response(body, status, headers={"content-type": "text/plain"})

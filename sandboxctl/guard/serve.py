"""The running guard's own HTTP: ``/metrics`` (Prometheus), ``/status`` (the
``GuardStatus`` JSON) and ``/healthz`` (200 once the caches synced, else 503)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from sandboxctl.core.errors import ConfigurationError


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
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def serve(self, host: str, port: int) -> int:
        """Serve on a thread; the bound port (one line and exit 2 when it cannot listen)."""
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, generate_latest(outer._registry), CONTENT_TYPE_LATEST)
                elif path == "/status":
                    body = json.dumps(outer._status(), indent=2).encode()
                    self._send(200, body, "application/json")
                elif path == "/healthz":
                    ok = outer._healthy()
                    self._send(200 if ok else 503, b"ok\n" if ok else b"syncing\n", "text/plain")
                else:
                    self._send(404, b"not found\n", "text/plain")

            def _send(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        try:
            self._server = ThreadingHTTPServer((host, port), Handler)
        except OSError as error:
            raise ConfigurationError(
                f"--listen {host}:{port}: cannot listen: {error.strerror}"
            ) from None
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="guard-http", daemon=True
        )
        self._thread.start()
        return int(self._server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

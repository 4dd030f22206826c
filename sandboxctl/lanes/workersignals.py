"""The guard lanes' workers, as the guard reads them: a sessions endpoint (``{pod: count}``,
for ``--busy-source sessions=URL``) and per-pod probes (``{busy, queries}`` or a failing
status, for ``--busy-source probe=URL-TEMPLATE``), served over HTTP on loopback by the
lanes' own process. Counts each guard's polls of the sessions endpoint, so a lane can say
how many guard ticks a change took."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

UNRESPONSIVE = 503  # what a draining worker's probe answers


class WorkerSignals:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self._lock = threading.Lock()
        self._sessions: dict[str, int] = {}
        self._probes: dict[str, dict[str, Any] | int] = {}
        self._polls: dict[str, int] = {}
        signals = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                status, body = signals._answer(self.path)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="lanes-worker-signals", daemon=True
        )
        self._thread.start()

    def _answer(self, path: str) -> tuple[int, Any]:
        with self._lock:
            if path.startswith("/sessions/"):
                reader = path.removeprefix("/sessions/")
                self._polls[reader] = self._polls.get(reader, 0) + 1
                return 200, dict(self._sessions)
            if path.startswith("/probe/"):
                answer = self._probes.get(path.rsplit("/", 1)[-1], UNRESPONSIVE)
                if isinstance(answer, int):
                    return answer, {"error": "unresponsive"}
                return 200, answer
        return 404, {"error": "not found"}

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def sessions_url(self, reader: str) -> str:
        """The sessions endpoint for ``reader`` (a guard): each reader's polls are counted."""
        return f"{self.url}/sessions/{reader}"

    @property
    def probe_template(self) -> str:
        return f"{self.url}/probe/{{namespace}}/{{name}}"

    def polls(self, reader: str) -> int:
        """Reads of the sessions endpoint by ``reader`` so far (one per guard tick)."""
        with self._lock:
            return self._polls.get(reader, 0)

    def set_busy(self, pod: str, busy: bool) -> None:
        """One session on ``pod`` (and a probe reporting a running query), or none."""
        with self._lock:
            if busy:
                self._sessions[pod] = 1
                self._probes[pod] = {"busy": True, "queries": 1}
            else:
                self._sessions.pop(pod, None)
                self._probes[pod] = {"busy": False, "queries": 0}

    def set_unresponsive(self, pod: str) -> None:
        """``pod`` stops answering its probe (it drains: a draining worker refuses RPCs)."""
        with self._lock:
            self._probes[pod] = UNRESPONSIVE

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

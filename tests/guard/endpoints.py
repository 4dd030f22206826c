"""What the workers answer, over real HTTP on loopback: the sessions endpoint
(``{pod: count}``) and per-pod probes (``{busy, queries}``, or a failure), and a black
hole that accepts connections and never answers (for timeouts)."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class WorkerEndpoints:
    def __init__(self) -> None:
        self.sessions: dict[str, Any] = {}
        self.sessions_status = 200
        self.sessions_hits = 0
        self.probes: dict[str, Any] = {}  # pod name -> answer dict, or an int status
        self.probe_hits = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                if self.path == "/sessions":
                    outer.sessions_hits += 1
                    self._send(outer.sessions_status, outer.sessions)
                    return
                if self.path.startswith("/probe/"):
                    outer.probe_hits += 1
                    name = self.path.rsplit("/", 1)[-1]
                    answer = outer.probes.get(name, 503)
                    if isinstance(answer, int):
                        self._send(answer, {"error": "down"})
                    else:
                        self._send(200, answer)
                    return
                self._send(404, {})

            def _send(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def sessions_url(self) -> str:
        return self.url + "/sessions"

    @property
    def probe_template(self) -> str:
        return self.url + "/probe/{namespace}/{name}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class BlackHole:
    """Accepts connections and reads, never answers; counts connections open at once."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.open = 0
        self.most_open = 0
        self._lock = threading.Lock()
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._closing:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        with self._lock:
            self.open += 1
            self.most_open = max(self.most_open, self.open)
        try:
            while conn.recv(65536):
                pass
        except OSError:
            pass
        finally:
            conn.close()
            with self._lock:
                self.open -= 1

    def close(self) -> None:
        self._closing = True
        self._sock.close()

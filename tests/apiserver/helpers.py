"""Serving an app on loopback in this process, and reading a watch stream with a deadline."""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import queue
import shutil
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from sandboxctl.apiserver.auth import ALL_NAMESPACES, KubeTokens
from sandboxctl.fleet.certificate import fleet_certificate
from sandboxctl.serving import Tls
from tests.sandboxd.servers import wait_until

# The Sandbox API's test token: every namespace. Stacks serve the API with KUBE_TOKENS,
# and clients send AUTH (kubeconfigs carry KUBE_TOKEN).
KUBE_TOKEN = "kube-test-token"
KUBE_TOKENS = KubeTokens({KUBE_TOKEN: frozenset({ALL_NAMESPACES})})
AUTH = {"Authorization": f"Bearer {KUBE_TOKEN}"}


@functools.cache
def kube_tls() -> Tls:
    """A self-signed certificate for 127.0.0.1, made once per session: kubectl sends a
    kubeconfig's token only over HTTPS."""
    directory = Path(tempfile.mkdtemp(prefix="sandboxctl-test-tls-", dir="/tmp"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return fleet_certificate(directory, "127.0.0.1")


def trusting() -> ssl.SSLContext:
    """What an httpx client passes as ``verify`` to talk to a server of ``kube_tls()``."""
    return ssl.create_default_context(cafile=str(kube_tls().cert_file))


@contextmanager
def serving(app: Any, port: int = 0, tls: Tls | None = None) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 (a free port unless given; HTTPS with ``tls``); yields
    its base URL."""
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="error",
        lifespan="off",
        loop="asyncio",
        ssl_certfile=str(tls.cert_file) if tls else None,
        ssl_keyfile=str(tls.key_file) if tls else None,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), what="the server to listen")
    if not server.started:
        raise AssertionError("the server did not start")
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        # uvicorn waits for open responses, so this also proves every watch ended.
        assert not thread.is_alive(), "the server did not shut down: a response is still open"


class Lines:
    """Lines of a long-lived text stream, read on a thread; ``next`` waits with a deadline."""

    _END = object()

    def __init__(self, lines: Iterator[str], on_close: Callable[[], None]) -> None:
        self._queue: queue.Queue[object] = queue.Queue()
        self._on_close = on_close
        self.seen: list[str] = []
        self._thread = threading.Thread(target=self._pump, args=(lines,), daemon=True)
        self._thread.start()

    def _pump(self, lines: Iterator[str]) -> None:
        try:
            for line in lines:
                if line.strip():
                    self._queue.put(line)
        except Exception as error:  # the stream was closed under us, or failed
            self._queue.put(error)
        finally:
            self._queue.put(self._END)

    def next(self, timeout: float = 10.0) -> str | None:
        """The next line, or None when the stream ended; fails after ``timeout`` s."""
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout}s; seen so far: {self.seen}") from None
        if item is self._END:
            self._queue.put(self._END)
            return None
        if isinstance(item, Exception):
            raise item
        assert isinstance(item, str)
        self.seen.append(item)
        return item

    def until(self, check: Callable[[str], bool], timeout: float = 15.0, what: str = "") -> str:
        """Read lines until one passes ``check``; fail at the deadline or the end."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.next(timeout=max(0.01, deadline - time.monotonic()))
            if line is None:
                raise AssertionError(f"the stream ended before {what or 'the line'}: {self.seen}")
            if check(line):
                return line

    def close(self) -> None:
        self._on_close()


@contextmanager
def watch(client: httpx.Client, path: str, **params: Any) -> Iterator[WatchEvents]:
    """Open a watch; yields its events as parsed JSON, read with deadlines."""
    headers = params.pop("headers", {})
    with client.stream(
        "GET", path, params={"watch": "true", **params}, headers=headers, timeout=None
    ) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("application/json")
        lines = Lines(response.iter_lines(), lambda: hang_up(response))
        try:
            yield WatchEvents(lines)
        finally:
            lines.close()


def hang_up(response: httpx.Response) -> None:
    """Close a streamed response whose lines another thread is blocked reading.

    Closing the socket alone would not wake that thread's recv (nor send the FIN that
    tells the server the client went away); shutting it down does both."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    response.close()


class WatchEvents:
    def __init__(self, lines: Lines) -> None:
        self.lines = lines

    def next(self, timeout: float = 10.0) -> dict[str, Any] | None:
        line = self.lines.next(timeout)
        return None if line is None else json.loads(line)  # type: ignore[no-any-return]

    def take(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        events = []
        for _ in range(count):
            event = self.next(timeout)
            assert event is not None, f"the watch ended after {events}"
            events.append(event)
        return events

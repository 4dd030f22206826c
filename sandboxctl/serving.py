"""Run an ASGI app with uvicorn until SIGINT or SIGTERM, then return to the caller.

uvicorn re-raises the stop signal once it has shut down, which ends the process before
the caller can stop its own loops (and exits with -15, not 0). Every long-lived sandboxctl
service serves through here instead, so shutdown code after it always runs.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import uvicorn

from sandboxctl.core.errors import ConfigurationError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# uvloop cuts the event loop's own cost per request, which is most of what a relay costs
# (serve-proxy uses it); the agent keeps asyncio, whose subprocess start is much faster
# than uvloop's, and every command envd runs is one.
Loop = Literal["asyncio", "uvloop"]
SHUTDOWN_GRACE_SECONDS = 2


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def bind(host: str, port: int) -> socket.socket:
    """Listen now, so a taken port fails before anything else starts (one line, exit 2)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as error:
        raise ConfigurationError(f"cannot listen on {host}:{port}: {error.strerror}") from None
    return sock


def run_server(app: Any, sock: socket.socket, loop: Loop = "asyncio") -> None:
    """Serve one app on a bound socket until a stop signal; returns after shutdown."""
    run_servers([(app, sock)], loop)


def run_servers(listeners: Sequence[tuple[Any, socket.socket]], loop: Loop = "asyncio") -> None:
    """Serve each app on its own bound socket, in one server and one event loop, until
    a stop signal; returns after a graceful shutdown. Requests go to the app of the
    socket they arrived on."""
    by_address = {_address(sock): app for app, sock in listeners}

    async def dispatch(scope: Any, receive: Any, send: Any) -> None:
        server = scope.get("server")
        app = by_address.get(tuple(server)) if server else None
        if app is None:  # one listener, or a server address uvicorn did not give
            app = listeners[0][0]
        await app(scope, receive, send)

    config = uvicorn.Config(
        dispatch,
        log_level="warning",
        access_log=False,
        lifespan="off",
        loop=loop,
        # Open watches would hold a stop for as long as they run; like a Kubernetes API
        # server, give them a short grace and close them (clients re-establish them).
        timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS,
    )
    with contextlib.ExitStack() as stack:
        for _, sock in listeners:
            stack.enter_context(sock)
        _Server(config).run(sockets=[sock for _, sock in listeners])


def _address(sock: socket.socket) -> tuple[str, int]:
    host, port = sock.getsockname()[:2]
    return str(host), int(port)

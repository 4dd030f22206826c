"""Run an ASGI app with uvicorn until SIGINT or SIGTERM, then return to the caller.

uvicorn re-raises the stop signal once it has shut down, which ends the process before
the caller can stop its own loops (and exits with -15, not 0). Every long-lived sandboxctl
service serves through here instead, so shutdown code after it always runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import ssl
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from sandboxctl.core.errors import ConfigurationError

log = logging.getLogger("sandboxctl")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# uvloop cuts the event loop's own cost per request, which is most of what a relay costs
# (serve-proxy uses it); the agent keeps asyncio, whose subprocess start is much faster
# than uvloop's, and every command envd runs is one.
Loop = Literal["asyncio", "uvloop"]
SHUTDOWN_GRACE_SECONDS = 2


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, peers: Sequence[_Server] = ()) -> None:
        super().__init__(config)
        self.peers = peers  # servers in the same loop that stop when this one does

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

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        for peer in self.peers:
            peer.should_exit, peer.force_exit = self.should_exit, self.force_exit


class _Peer(_Server):
    """A server that runs beside a :class:`_Server` in its loop and takes its signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


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


@dataclass(frozen=True, slots=True)
class Tls:
    """A certificate (PEM, the chain after it) and its private key, for serving HTTPS.

    With ``client_ca`` a client may present a certificate, which must be signed by that
    CA (else the handshake fails); the app finds the verified certificate, or None, in
    ``scope["extensions"]["tls"]["client_cert"]`` (the dict ``ssl`` gives)."""

    cert_file: Path
    key_file: Path
    client_ca: Path | None = None


def tls_files(cert_file: Path | None, key_file: Path | None) -> Tls | None:
    """The ``--tls-cert-file``/``--tls-private-key-file`` pair, checked now (one line,
    exit 2, before anything listens): both or neither, readable, and a matching pair."""
    if cert_file is None and key_file is None:
        return None
    if cert_file is None or key_file is None:
        raise ConfigurationError("--tls-cert-file and --tls-private-key-file go together")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert_file, key_file)
    except OSError as error:
        problem = error.strerror or str(error)
        if isinstance(error, ssl.SSLError):
            problem = f"not a certificate and its private key ({error.reason or error})"
        raise ConfigurationError(
            f"--tls-cert-file {cert_file} --tls-private-key-file {key_file}: {problem}"
        ) from None
    return Tls(cert_file, key_file)


def run_server(app: Any, sock: socket.socket, loop: Loop = "asyncio") -> None:
    """Serve one app on a bound socket until a stop signal; returns after shutdown."""
    run_servers([(app, sock)], loop)


def run_servers(
    listeners: Sequence[tuple[Any, socket.socket]],
    loop: Loop = "asyncio",
    tls: Tls | None = None,
    tls_only: Collection[socket.socket] | None = None,
) -> None:
    """Serve each app on its own bound socket, in one event loop, until a stop signal;
    returns after a graceful shutdown. Requests go to the app of the socket they arrived
    on. With ``tls`` the sockets of ``tls_only`` (default: every one) serve HTTPS only,
    the others plain HTTP (one uvicorn server for each kind, stopped together)."""
    by_address = {_address(sock): app for app, sock in listeners}

    async def dispatch(scope: Any, receive: Any, send: Any) -> None:
        server = scope.get("server")
        app = by_address.get(tuple(server)) if server else None
        if app is None:  # one listener, or a server address uvicorn did not give
            app = listeners[0][0]
        await app(scope, receive, send)

    def config(secure: Tls | None) -> uvicorn.Config:
        return uvicorn.Config(
            dispatch,
            log_level="warning",
            # uvicorn's lines go to the root logger: the service's format, escaped (cli/logs.py).
            log_config=None,
            access_log=False,
            lifespan="off",
            loop=loop,
            # Open watches would hold a stop for as long as they run; like a Kubernetes
            # API server, give them a short grace and close them (clients come back).
            timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS,
            ssl_certfile=str(secure.cert_file) if secure else None,
            ssl_keyfile=str(secure.key_file) if secure else None,
            **(_client_certs(secure.client_ca) if secure and secure.client_ca else {}),
        )

    sockets = [sock for _, sock in listeners]
    secure = [] if tls is None else [s for s in sockets if tls_only is None or s in tls_only]
    plain = [sock for sock in sockets if sock not in secure]
    groups = [(config(None), plain), (config(tls), secure)]
    groups = [(settings, group) for settings, group in groups if group]
    peers = [_Peer(settings) for settings, _ in groups[1:]]
    main = _Server(groups[0][0], peers)
    with contextlib.ExitStack() as stack:
        for sock in sockets:
            stack.enter_context(sock)
        if not peers:
            main.run(sockets=groups[0][1])
            return

        async def serve_all() -> None:
            servers = [main, *peers]
            await asyncio.gather(
                *(s.serve(sockets=g) for s, (_, g) in zip(servers, groups, strict=True))
            )

        with asyncio.Runner(loop_factory=groups[0][0].get_loop_factory()) as runner:
            runner.run(serve_all())


def _client_certs(client_ca: Path) -> dict[str, Any]:
    """uvicorn settings that ask for a client certificate and hand it to the app."""
    return {
        "ssl_ca_certs": str(client_ca),
        "ssl_cert_reqs": ssl.CERT_OPTIONAL,
        "http": _PeerCertProtocol,
    }


class _PeerCertProtocol(H11Protocol):
    """h11, with the connection's verified client certificate in every request's scope
    (uvicorn puts none there); asyncio calls ``connection_made`` after the handshake."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        certificate = transport.get_extra_info("peercert") or None
        app = self.app

        async def with_certificate(scope: Scope, receive: Receive, send: Send) -> None:
            scope.setdefault("extensions", {})["tls"] = {"client_cert": certificate}
            await app(scope, receive, send)

        self.app = with_certificate


def _address(sock: socket.socket) -> tuple[str, int]:
    host, port = sock.getsockname()[:2]
    return str(host), int(port)


class BodyCap:
    """ASGI middleware: read a request's body up to ``limit`` bytes before the app runs,
    and answer ``refuse(limit)`` (a JSON body) with 413 past it, announced or streamed.

    The app then gets the whole body at once, so a client that hangs up while sending
    it costs one log line here instead of a traceback in a route. Only for apps whose
    bodies are small JSON documents: it buffers what it lets through.
    """

    def __init__(self, app: ASGIApp, limit: int, refuse: Callable[[int], bytes]) -> None:
        self.app = app
        self.limit = limit
        self.refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await self._too_large(send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                log.info(
                    "%s %s: the client hung up while sending its body",
                    scope["method"],
                    scope["path"],
                )
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._too_large(send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send) -> None:
        payload = self.refuse(self.limit)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(payload)),
            (b"connection", b"close"),  # the rest of the body is not read
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

"""Run an ASGI app with uvicorn until SIGINT or SIGTERM, then return to the caller.

uvicorn re-raises the stop signal once it has shut down, which ends the process before
the caller can stop its own loops (and exits with -15, not 0). Every long-lived sandboxctl
service serves through here instead, so shutdown code after it always runs, and every
listener reads requests within the same bounds (``bounds.py``: a slow or silent client
cannot hold a connection, nor a listener take more than its limit of them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import ssl
import threading
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import uvicorn
from starlette.types import Receive, Scope, Send

from sandboxctl.core.errors import ConfigurationError
from sandboxctl.serving.bounds import (
    BoundedConfig,
    BoundedH11,
    BoundedHttpTools,
    ReadBounds,
    fit_open_files,
)

log = logging.getLogger("sandboxctl")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# uvloop cuts the event loop's own cost per request, which is most of what a relay costs
# (serve-proxy uses it); the agent keeps asyncio, whose subprocess start is much faster
# than uvloop's, and every command envd runs is one.
Loop = Literal["asyncio", "uvloop"]
SHUTDOWN_GRACE_SECONDS = 2


class _Server(uvicorn.Server):
    def __init__(self, config: BoundedConfig, peers: Sequence[_Server] = ()) -> None:
        super().__init__(config)
        self.bounds = config.bounds
        self.peers = peers  # servers in the same loop that stop when this one does

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if self.config.ssl is not None:
            _bound_tls_handshakes(asyncio.get_running_loop(), self.bounds.head_timeout)
        await super().startup(sockets)

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


def _bound_tls_handshakes(loop: asyncio.AbstractEventLoop, seconds: float) -> None:
    """Make ``loop``'s TLS servers cut a handshake after ``seconds``: uvicorn gives asyncio
    no handshake timeout (its default is 60 s), and the head bound counts from the accept,
    the handshake included. The loop is this module's own, for this server's life."""
    if "create_server" in vars(loop):
        return  # done for another server of the same loop
    create_server = loop.create_server

    def bounded(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("ssl") is not None:
            kwargs.setdefault("ssl_handshake_timeout", seconds)
        return create_server(*args, **kwargs)

    loop.create_server = bounded  # type: ignore[method-assign]


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


def run_server(
    app: Any, sock: socket.socket, loop: Loop = "asyncio", bounds: ReadBounds | None = None
) -> None:
    """Serve one app on a bound socket until a stop signal; returns after shutdown."""
    run_servers([(app, sock)], loop, bounds=bounds)


def run_servers(
    listeners: Sequence[tuple[Any, socket.socket]],
    loop: Loop = "asyncio",
    tls: Tls | None = None,
    tls_only: Collection[socket.socket] | None = None,
    bounds: ReadBounds | None = None,
) -> None:
    """Serve each app on its own bound socket, in one event loop, until a stop signal;
    returns after a graceful shutdown. Requests go to the app of the socket they arrived
    on. With ``tls`` the sockets of ``tls_only`` (default: every one) serve HTTPS only,
    the others plain HTTP (one uvicorn server for each kind, stopped together). Every
    socket reads requests within ``bounds`` (default: the defaults of bounds.py), with at
    most its ``max_connections`` at once, fewer when the open-file limit is short."""
    bounds = fit_open_files(bounds or ReadBounds(), len(listeners))
    # By port: a socket bound to every address sees each local address a client picks.
    by_port = {_address(sock)[1]: app for app, sock in listeners}
    if len(by_port) < len(listeners):
        raise ConfigurationError("two listeners of one process share a port")

    async def dispatch(scope: Any, receive: Any, send: Any) -> None:
        server = scope.get("server")
        app = by_port.get(server[1]) if server else None
        if app is None:  # one listener, or a server address uvicorn did not give
            app = listeners[0][0]
        await app(scope, receive, send)

    def config(secure: Tls | None, group: Sequence[socket.socket]) -> BoundedConfig:
        return _config(dispatch, bounds, group, loop, secure)

    sockets = [sock for _, sock in listeners]
    secure = [] if tls is None else [s for s in sockets if tls_only is None or s in tls_only]
    plain = [sock for sock in sockets if sock not in secure]
    groups = [(config(None, plain), plain), (config(tls, secure), secure)]
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


class InBackground:
    """One app served on a thread of its own until :meth:`close`, for a service whose
    main loop is not an event loop (the publisher's and the guard's ``/metrics``)."""

    def __init__(self, app: Any, sock: socket.socket, bounds: ReadBounds | None = None) -> None:
        self._sock = sock
        settings = _config(app, fit_open_files(bounds or ReadBounds(), 1), [sock], "asyncio")
        self._server = _Server(settings)  # takes no signals off the main thread
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="http", daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return _address(self._sock)[1]

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=SHUTDOWN_GRACE_SECONDS + 5)
        self._sock.close()


def _config(
    app: Any,
    bounds: ReadBounds,
    group: Sequence[socket.socket],
    loop: Loop,
    secure: Tls | None = None,
) -> BoundedConfig:
    """The uvicorn settings of the sockets of ``group``, HTTPS with ``secure``."""
    client_certs = secure is not None and secure.client_ca is not None
    return BoundedConfig(
        app,
        bounds,
        [_address(sock) for sock in group],
        log_level="warning",
        # uvicorn's lines go to the root logger: the service's format, escaped (cli/logs.py).
        log_config=None,
        access_log=False,
        lifespan="off",
        interface="asgi3",  # every app here is; uvicorn's guess takes a method for ASGI 2
        loop=loop,
        # Open watches would hold a stop for as long as they run; like a Kubernetes
        # API server, give them a short grace and close them (clients come back).
        timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS,
        ssl_certfile=str(secure.cert_file) if secure else None,
        ssl_keyfile=str(secure.key_file) if secure else None,
        http=_PeerCertProtocol if client_certs else BoundedHttpTools,
        **(_client_certs(secure.client_ca) if secure and secure.client_ca else {}),
    )


def _client_certs(client_ca: Path) -> dict[str, Any]:
    """uvicorn settings that ask for a client certificate (``_PeerCertProtocol`` hands
    it to the app)."""
    return {"ssl_ca_certs": str(client_ca), "ssl_cert_reqs": ssl.CERT_OPTIONAL}


class _PeerCertProtocol(BoundedH11):
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

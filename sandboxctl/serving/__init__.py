"""Serve ASGI apps with uvicorn as a part of a process manager (``lifecycle``): a
:class:`Served` runs until its stop, then shuts down gracefully and returns.

uvicorn would take SIGINT and SIGTERM itself and re-raise them once shut down, ending the
process before its other parts stop; here the manager takes them, and every listener
reads requests within the same bounds (``bounds.py``: a slow or silent client cannot
hold a connection, nor a listener take more than its limit of them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import uvicorn
from starlette.types import Receive, Scope, Send

from sandboxctl.core.errors import ConfigurationError
from sandboxctl.lifecycle import Background, Stop
from sandboxctl.serving.bounds import (
    BoundedConfig,
    BoundedH11,
    BoundedHttpTools,
    ReadBounds,
    fit_open_files,
)

log = logging.getLogger("sandboxctl")

# uvloop cuts the event loop's own cost per request, which is most of what a relay costs
# (serve-proxy uses it); the agent keeps asyncio, whose subprocess start is much faster
# than uvloop's, and every command envd runs is one.
Loop = Literal["asyncio", "uvloop"]
SHUTDOWN_GRACE_SECONDS = 2


class _Server(uvicorn.Server):
    def __init__(self, config: BoundedConfig) -> None:
        super().__init__(config)
        self.bounds = config.bounds

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if self.config.ssl is not None:
            _bound_tls_handshakes(asyncio.get_running_loop(), self.bounds.head_timeout)
        await super().startup(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the process manager takes the signals (lifecycle)


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


class Served:
    """Each app served on its own bound socket, in one event loop, until the stop; then a
    graceful shutdown. Requests go to the app of the socket they arrived on. With ``tls``
    the sockets of ``tls_only`` (default: every one) serve HTTPS only, the others plain
    HTTP (one uvicorn server for each kind, stopped together). Every socket reads
    requests within ``bounds`` (default: the defaults of bounds.py), with at most its
    ``max_connections`` at once, fewer when the open-file limit is short. The sockets are
    closed when it returns."""

    name = "http"

    def __init__(
        self,
        listeners: Sequence[tuple[Any, socket.socket]],
        loop: Loop = "asyncio",
        tls: Tls | None = None,
        tls_only: Collection[socket.socket] | None = None,
        bounds: ReadBounds | None = None,
    ) -> None:
        bounds = fit_open_files(bounds or ReadBounds(), len(listeners))
        # By port: a socket bound to every address sees each local address a client picks.
        self._by_port = {_address(sock)[1]: app for app, sock in listeners}
        if len(self._by_port) < len(listeners):
            raise ConfigurationError("two listeners of one process share a port")
        self._first = listeners[0][0]
        self.sockets = [sock for _, sock in listeners]
        secure = (
            [] if tls is None else [s for s in self.sockets if tls_only is None or s in tls_only]
        )
        plain = [sock for sock in self.sockets if sock not in secure]
        groups = [(_config(self._dispatch, bounds, plain, loop), plain)]
        groups.append((_config(self._dispatch, bounds, secure, loop, tls), secure))
        self._groups = [(settings, group) for settings, group in groups if group]

    async def _dispatch(self, scope: Any, receive: Any, send: Any) -> None:
        server = scope.get("server")
        app = self._by_port.get(server[1]) if server else None
        if app is None:  # one listener, or a server address uvicorn did not give
            app = self._first
        await app(scope, receive, send)

    def run(self, stop: Stop) -> None:
        servers = [_Server(settings) for settings, _ in self._groups]

        def exit_all() -> None:
            for server in servers:
                server.should_exit = True  # uvicorn's loop sees it within 0.1 s

        stop.on_set(exit_all)

        async def serve_all() -> None:
            await asyncio.gather(
                *(s.serve(sockets=g) for s, (_, g) in zip(servers, self._groups, strict=True))
            )

        closed = _ClosedAtTheGrace()
        uvicorn_log = logging.getLogger("uvicorn.error")
        with contextlib.ExitStack() as stack:
            for sock in self.sockets:
                stack.enter_context(sock)
            uvicorn_log.addFilter(closed)
            stack.callback(uvicorn_log.removeFilter, closed)
            with asyncio.Runner(loop_factory=self._groups[0][0].get_loop_factory()) as runner:
                runner.run(serve_all())
        if closed.count:
            log.info(
                "closed %d open request(s) at the end of the %ss shutdown grace (watches, "
                "command streams)",
                closed.count,
                SHUTDOWN_GRACE_SECONDS,
            )


class _ClosedAtTheGrace(logging.Filter):
    """uvicorn cancels the requests still open when its shutdown grace ends (a watch, a
    command's output stream) and logs each as an application error with a traceback:
    closing them is what the grace is for. Counted instead, and said once."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        message = record.getMessage()
        if isinstance(error, asyncio.CancelledError) and message.startswith(
            "Exception in ASGI application"
        ):
            self.count += 1
            return False
        return not message.endswith("timeout graceful shutdown exceeded")  # "Cancel N ..."


class InBackground(Background):
    """One app served on a thread of its own until :meth:`close`, for a service that
    serves only on the side (the publisher's and the guard's ``/metrics``)."""

    def __init__(self, app: Any, sock: socket.socket, bounds: ReadBounds | None = None) -> None:
        self._sock = sock
        super().__init__(
            Served([(app, sock)], bounds=bounds), join_timeout=SHUTDOWN_GRACE_SECONDS + 5
        )
        self.start()

    @property
    def port(self) -> int:
        return _address(self._sock)[1]

    def close(self) -> None:
        self.stop()
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

"""How long a client may take to send a request, and how many connections a listener
holds: what uvicorn 0.54 leaves unbounded.

uvicorn closes a connection that idles between two requests (keep-alive, 5 s), but not one
that never sends a byte, one that trickles a request head a line at a time (each byte
cancels its keep-alive timer and nothing arms another), a head of any size (httptools keeps
all of it), or a body that stops arriving; and its ``limit_concurrency`` answers 503 only
after a head, counting every listener of a server together. The protocols here add, per
connection:

- **the head bound**: a request head must be complete within ``head_timeout`` of the
  connection's start (its accept: a TLS handshake counts, and is itself cut there) or of
  its first byte after a keep-alive. Trickling does not extend it. Past it: 408 and close.
- **a head size bound**: ``MAX_HEAD_BYTES``; past it: 431 and close.
- **the body bound**: while a request body is incomplete, the connection is closed once no
  byte of it has arrived for ``body_idle_timeout``. A steady upload, however slow in all,
  is never cut; time the server holds the body back itself (a full buffer the app has not
  read, an unanswered ``Expect: 100-continue``) does not count.
- **per listener**, at most ``max_connections`` connections at once; one more is closed at
  once, before anything is read from it.

Responses are not bounded: a watch, or a process's output stream, lasts as long as it has
something to say. Connections closed by a bound are counted and logged once a minute per
listener, not one line each (an attack would be a flood).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

log = logging.getLogger("sandboxctl")

# Chosen for clients we serve (docs/security.md#connections-and-slow-clients says why).
DEFAULT_HEAD_TIMEOUT = 10.0
DEFAULT_BODY_IDLE_TIMEOUT = 120.0  # the e2b SDK's input streams ping every 50 s
DEFAULT_MAX_CONNECTIONS = 4096
MAX_HEAD_BYTES = 64 * 1024  # kubectl's and the SDKs' heads are a few KiB with their tokens
LOG_EVERY = 60.0  # seconds between two lines of one listener's closed connections
# Open files a connection may cost: its socket, and what serving it may open (the proxy's
# connection to an agent, the pipes of a process envd starts).
FILES_PER_CONNECTION = 2
RESERVED_FILES = 1024  # the process's own (state, sandboxes' pidfds, its clients), at most


@dataclass(frozen=True, slots=True)
class ReadBounds:
    """What every listener of a service bounds (seconds, and connections per listener)."""

    head_timeout: float = DEFAULT_HEAD_TIMEOUT
    body_idle_timeout: float = DEFAULT_BODY_IDLE_TIMEOUT
    max_connections: int = DEFAULT_MAX_CONNECTIONS


Address = tuple[str, int]


def fit_open_files(bounds: ReadBounds, listeners: int) -> ReadBounds:
    """``bounds`` with the connections every listener may hold within this process's
    open-file limit: the soft limit is raised as far as needed (up to the hard one), and
    the connections per listener are lowered, with a warning, when even that is short."""
    needed = listeners * bounds.max_connections * FILES_PER_CONNECTION + RESERVED_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return bounds
    raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
        soft = raised
    if soft >= needed:
        return bounds
    reserved = min(RESERVED_FILES, soft // 2)
    fits = max(1, (soft - reserved) // (listeners * FILES_PER_CONNECTION))
    log.warning(
        "this process may open %d files (RLIMIT_NOFILE; LimitNOFILE= in a systemd unit): "
        "each of its %d listeners holds at most %d connections, not %d (--max-connections)",
        soft,
        listeners,
        fits,
        bounds.max_connections,
    )
    return replace(bounds, max_connections=fits)


class _Tally:
    """One kind of connection a listener closed, logged at most once a minute."""

    def __init__(self, listener: Address, what: str) -> None:
        self.listener = listener
        self.what = what
        self.count = 0
        self.next_line = 0.0

    def add(self, now: float) -> None:
        self.count += 1
        if now >= self.next_line:
            host, port = self.listener
            count = self.count
            log.warning("%s:%d: %s (%d since the last such line)", host, port, self.what, count)
            self.count = 0
            self.next_line = now + LOG_EVERY


class Listener:
    """The open connections of one listening socket."""

    def __init__(self, address: Address, bounds: ReadBounds) -> None:
        self.bounds = bounds
        self.open: set[object] = set()
        # WebSockets (guest ports): their protocol is uvicorn's from the upgrade on, so they
        # are counted by transport, and dropped from the count once it is closing.
        self.upgraded: list[asyncio.BaseTransport] = []
        limit = bounds.max_connections
        self.refused = _Tally(address, f"refused new connections: {limit} are open")
        self.slow_heads = _Tally(
            address, f"closed connections whose request head took over {bounds.head_timeout:g}s"
        )
        self.large_heads = _Tally(
            address, f"closed connections whose request head was over {MAX_HEAD_BYTES} bytes"
        )
        self.stalled = _Tally(
            address,
            f"closed connections whose request body sent nothing for {bounds.body_idle_timeout:g}s",
        )

    def admit(self, connection: object) -> bool:
        if len(self.open) + len(self.upgraded) >= self.bounds.max_connections:
            self.upgraded = [t for t in self.upgraded if not t.is_closing()]
            if len(self.open) + len(self.upgraded) >= self.bounds.max_connections:
                return False
        self.open.add(connection)
        return True


class BoundedConfig(uvicorn.Config):
    """A uvicorn config whose connections know their listener, by its port: a socket
    bound to every address (0.0.0.0, ::) accepts on any local address a client picks
    (127.0.0.2, 127.0.0.3...), which must not make a listener, and a limit, of each."""

    def __init__(
        self, app: Any, bounds: ReadBounds, addresses: Sequence[Address], **kwargs: Any
    ) -> None:
        super().__init__(app, h11_max_incomplete_event_size=MAX_HEAD_BYTES, **kwargs)
        self.bounds = bounds
        self.listeners = {port: Listener((host, port), bounds) for host, port in addresses}

    def listener(self, address: Address) -> Listener:
        port = address[1]
        if port not in self.listeners:  # a socket this config was not told of
            self.listeners[port] = Listener(address, self.bounds)
        return self.listeners[port]


class _Http(Protocol):
    """What the bounds read of uvicorn's two HTTP/1.1 protocols (both have it)."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any  # the request in progress, or the last one, or None before the first
    flow: Any


# What a connection is reading: a request head (or waiting for one), a request body, or
# nothing (the request is in, its response may be on its way or done).
HEAD, BODY, DONE = "head", "body", "done"


class _Bounds:
    """The read bounds of one connection; its protocol calls it, and sets ``reading``
    as its parser goes."""

    def __init__(self, protocol: _Http, config: uvicorn.Config) -> None:
        if not isinstance(config, BoundedConfig):
            raise TypeError("bounded protocols are served with a BoundedConfig")
        self.protocol = protocol
        self.config = config
        self.bounds = config.bounds
        self.started = protocol.loop.time()  # at accept, before a TLS handshake
        self.listener: Listener | None = None
        self.reading = HEAD
        self.head_timer: asyncio.TimerHandle | None = None
        self.head_bytes = 0
        self.body_timer: asyncio.TimerHandle | None = None
        self.last_body = 0.0
        self.upgraded = False

    def admit(self, transport: asyncio.Transport) -> bool:
        """On connection_made: count it, or close it at once past the listener's limit."""
        host, port = transport.get_extra_info("sockname")[:2]
        listener = self.config.listener((str(host), int(port)))
        now = self.protocol.loop.time()
        if not listener.admit(self):
            listener.refused.add(now)
            transport.close()
            return False
        self.listener = listener
        left = self.bounds.head_timeout - (now - self.started)
        self.head_timer = self.protocol.loop.call_later(max(left, 0.0), self._head_late)
        return True

    def received(self, count: int) -> None:
        """After data_received: time the head while one is read, else the body."""
        if self.upgraded or self.listener is None or self.protocol.transport.is_closing():
            return
        cycle = self.protocol.cycle
        if self.reading == DONE and (cycle is None or cycle.response_complete):
            # Bytes after a finished exchange begin the next head, whatever the parser
            # makes of them: llhttp skips a blank line without a callback, and uvicorn's
            # keep-alive timer stops at any byte.
            self.reading = HEAD
        if self.reading == HEAD:
            self.head_bytes += count
            if self.head_bytes > MAX_HEAD_BYTES:
                self.listener.large_heads.add(self.protocol.loop.time())
                self._refuse(431, "Request Header Fields Too Large", "request head too large")
            elif self.head_timer is None:  # its first byte after a keep-alive
                self.head_timer = self.protocol.loop.call_later(
                    self.bounds.head_timeout, self._head_late
                )
            return
        self._stop_head_timer()
        self.head_bytes = 0
        if self.reading == BODY:
            self.last_body = self.protocol.loop.time()
            if self.body_timer is None:
                self.body_timer = self.protocol.loop.call_later(
                    self.bounds.body_idle_timeout, self._body_check
                )
        else:
            self._stop_body_timer()

    def lost(self) -> bool:
        """On connection_lost: whether the connection was admitted (uvicorn knows it)."""
        self._stop_head_timer()
        self._stop_body_timer()
        if self.listener is None:
            return False
        self.listener.open.discard(self)
        return True

    def upgrade(self) -> None:
        """After a WebSocket upgrade: its own protocol runs it, unbounded here."""
        self.upgraded = True
        self._stop_head_timer()
        self._stop_body_timer()
        if self.listener is not None:
            self.listener.open.discard(self)
            self.listener.upgraded.append(self.protocol.transport)

    def _head_late(self) -> None:
        self.head_timer = None
        if self.upgraded or self.protocol.transport.is_closing() or self.reading != HEAD:
            return
        assert self.listener is not None
        self.listener.slow_heads.add(self.protocol.loop.time())
        timeout = f"request head not received within {self.bounds.head_timeout:g}s"
        self._refuse(408, "Request Timeout", timeout)

    def _body_check(self) -> None:
        self.body_timer = None
        transport = self.protocol.transport
        if self.upgraded or transport.is_closing() or self.reading != BODY:
            return
        now = self.protocol.loop.time()
        cycle = self.protocol.cycle
        held = cycle is not None and cycle.waiting_for_100_continue
        if self.protocol.flow.read_paused or held:
            self.last_body = now  # the server holds the body back, not the client
        idle = now - self.last_body
        if idle < self.bounds.body_idle_timeout:
            left = self.bounds.body_idle_timeout - idle
            self.body_timer = self.protocol.loop.call_later(left, self._body_check)
            return
        assert self.listener is not None
        self.listener.stalled.add(now)
        transport.close()  # mid-request: the app sees the client gone

    def _refuse(self, status: int, reason: str, text: str) -> None:
        """Answer ``status`` and close; only close while a response is still on its way
        (the head late is a pipelined one's: a 408 would land inside that response)."""
        cycle = self.protocol.cycle
        if cycle is not None and not cycle.response_complete:
            self.protocol.transport.close()
            return
        body = f"{text}\n".encode()
        head = (
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.protocol.transport.write(head.encode() + body)
        self.protocol.transport.close()

    def _stop_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _stop_body_timer(self) -> None:
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None


class _Bounded:
    """What both bounded protocols share: the bounds made with the protocol, a connection
    admitted (or closed at once) before uvicorn sees it, and its loss told to them. Put
    before uvicorn's protocol in the bases."""

    read_bounds: _Bounds

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)  # type: ignore[call-arg]
        self.read_bounds = _Bounds(self, config)  # type: ignore[arg-type]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream server's transport (uvloop's is not an asyncio.Transport subclass)
        if self.read_bounds.admit(cast(asyncio.Transport, transport)):
            super().connection_made(transport)  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.read_bounds.lost():
            super().connection_lost(exc)  # type: ignore[misc]


class BoundedHttpTools(_Bounded, HttpToolsProtocol):
    """uvicorn's httptools protocol (what it serves plain HTTP with), bounded; its parser
    callbacks say what is being read."""

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self.read_bounds.received(len(data))

    def handle_websocket_upgrade(self) -> None:
        super().handle_websocket_upgrade()
        self.read_bounds.upgrade()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.read_bounds.reading = HEAD

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self.read_bounds.reading = BODY

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.read_bounds.reading = DONE


class BoundedH11(_Bounded, H11Protocol):
    """uvicorn's h11 protocol (serving/__init__.py serves client certificates with it),
    bounded; h11's state of the client says what is being read."""

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        state = self.conn.their_state
        self.read_bounds.reading = (
            HEAD if state is h11.IDLE else BODY if state is h11.SEND_BODY else DONE
        )
        self.read_bounds.received(len(data))

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        super().handle_websocket_upgrade(event)
        self.read_bounds.upgrade()

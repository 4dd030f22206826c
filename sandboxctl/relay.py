"""HTTP/1.1 exchanges over one connection, and WebSocket relays.

An exchange streams the request head and body out, parses the response head with
``httptools`` (the C parser uvicorn serves with) and hands its body on as it arrives. The
envd proxy relays to the agents with it (``proxy/upstream.py`` keeps their connections
alive) and the agent relays to guest ports inside sandboxes. A WebSocket is relayed
message by message between an ASGI server's socket and a ``websockets`` client.

Why not httpx: it did the same job at about 60 % of the proxy's CPU per request (its anyio
streams, pool liveness checks and cookie handling), which alone cost more than the 1 ms
the proxy may add.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final

import httptools
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

READ_SIZE: Final = 1 << 16


class UpstreamError(Exception):
    """The agent could not be reached, or broke off before or while answering."""


class Parsed:
    """httptools callbacks: what one response has shown so far."""

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.head_done = False
        self.keep_alive = False
        self.complete = False
        self.parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.head_done = True
        # Asked now: once the message is complete llhttp has reset and says False.
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True

    def feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            raise UpstreamError(f"the agent's answer does not parse: {error}") from None

    def take_body(self) -> bytes:
        chunks, self.body = self.body, []
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class Connection:
    def __init__(self, key: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.key = key
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def usable(self) -> bool:
        return not (self.writer.is_closing() or self.reader.at_eof())

    def close(self) -> None:
        self.writer.close()

    async def read(self) -> bytes:
        try:
            data = await self.reader.read(READ_SIZE)
        except OSError as error:
            raise UpstreamError(f"reading from the agent failed: {error}") from None
        if not data:
            raise UpstreamError("the agent closed the connection mid-answer")
        return data


class Response:
    """One response from an agent: its head at once, its body as it comes."""

    def __init__(self, connection: Connection, parsed: Parsed, head_only: bool) -> None:
        self._connection = connection
        self._parsed = parsed
        self._head_only = head_only
        self.status = parsed.parser.get_status_code()
        self.headers = parsed.headers

    def reusable(self) -> bool:
        """Whether the connection may carry the next request: the whole body was read
        and neither side asked to close. After a HEAD the parser would wait for the body
        the head announced, so that connection is not reused."""
        return (
            not self._head_only
            and self._parsed.complete
            and self._parsed.keep_alive
            and self._connection.usable()
        )

    async def body(self) -> AsyncIterator[tuple[bytes, bool]]:
        """The body in the pieces the agent's writes arrive in, each with whether it is
        the last: the end comes with the last data when they arrive together (the last
        piece may be empty)."""
        while True:
            done = self._head_only or self._parsed.complete
            if self._parsed.body or done:
                yield self._parsed.take_body(), done
            if done:
                return
            self._parsed.feed(await self._connection.read())


async def exchange_on(
    connection: Connection,
    head: bytes,
    body: AsyncIterator[bytes] | None,
    chunked: bool = False,
    head_only: bool = False,
) -> Response:
    """Send ``head`` (a whole request head) and ``body`` on ``connection``; the response
    once its head is in. Raises :class:`UpstreamError`; exceptions from ``body`` propagate."""
    await send_request(connection.writer, head, body, chunked)
    parsed = Parsed()
    while not parsed.head_done:
        parsed.feed(await connection.read())
    return Response(connection, parsed, head_only)


async def send_request(
    writer: asyncio.StreamWriter, head: bytes, body: AsyncIterator[bytes] | None, chunked: bool
) -> None:
    try:
        if body is None:
            writer.write(head)
        else:
            pending = [head]  # the head goes out with the first chunk: one segment, not two
            async for chunk in body:
                if chunked:
                    pending += (b"%x\r\n" % len(chunk), chunk, b"\r\n")
                else:
                    pending.append(chunk)
                writer.writelines(pending)
                pending = []
                await writer.drain()  # one chunk in flight: a large upload stays small
            if chunked:
                pending.append(b"0\r\n\r\n")
            writer.writelines(pending)
        await writer.drain()
    except OSError as error:
        raise UpstreamError(f"sending to the agent failed: {error}") from None


# --- kept-alive connections -------------------------------------------------------------

Opener = Callable[[str], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
IDLE_SECONDS: Final = 1.0
MAX_IDLE_PER_AGENT: Final = 32


class Upstream:
    """Kept-alive HTTP/1.1 connections to the agents, for one event loop."""

    def __init__(
        self,
        connect_timeout: float,
        idle_seconds: float = IDLE_SECONDS,
        max_idle_per_agent: int = MAX_IDLE_PER_AGENT,
        on_connect: Callable[[], None] = lambda: None,
        opener: Opener | None = None,
    ) -> None:
        """``opener`` opens a connection for a key (default: the key is an agent address,
        ``host:port`` or an ``http(s)://`` URL, reached over TCP)."""
        self.connect_timeout = connect_timeout
        self.idle_seconds = idle_seconds
        self.max_idle_per_agent = max_idle_per_agent
        self._idle: dict[str, list[Connection]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._on_connect = on_connect
        self._opener = opener or _open_tcp

    @asynccontextmanager
    async def exchange(
        self,
        address: str,
        head: bytes,
        body: AsyncIterator[bytes] | None,
        *,
        chunked: bool = False,
        head_only: bool = False,
        connection: Connection | None = None,
    ) -> AsyncIterator[Response]:
        """Send ``head`` (a whole request head) and ``body`` to the agent at ``address``
        (``host:port``, or an ``http(s)://`` URL); yields the response once its head is
        in. ``chunked`` frames the body in chunks (the head must say so). Raises
        :class:`UpstreamError` when the agent cannot be reached or does not answer;
        exceptions from ``body`` propagate. ``connection`` (from :meth:`connect`) is
        used instead of taking one."""
        if connection is None:
            connection = await self.connect(address)
        response: Response | None = None
        try:
            response = await exchange_on(connection, head, body, chunked, head_only)
            yield response
        finally:
            if response is not None and response.reusable():
                self._put(connection)
            else:
                connection.close()

    async def connect(self, address: str) -> Connection:
        """A kept-alive connection to ``address``, or a new one (:class:`UpstreamError`
        when it cannot be opened): a caller that can go elsewhere asks first."""
        return self._take(address) or await self._connect(address)

    def close(self) -> None:
        """Close every idle connection (one in use closes when its exchange ends)."""
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()

    async def _connect(self, address: str) -> Connection:
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await self._opener(address)
        except (OSError, TimeoutError) as error:
            raise UpstreamError(f"cannot connect to {address}: {error or 'timed out'}") from None
        self._on_connect()
        return Connection(address, reader, writer)

    def _take(self, key: str) -> Connection | None:
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()  # the most recently used: the least likely to expire
            if connection.usable():
                return connection
            connection.close()
        return None

    def _put(self, connection: Connection) -> None:
        idle = self._idle.setdefault(connection.key, [])
        if len(idle) >= self.max_idle_per_agent:
            connection.close()
            return
        loop = asyncio.get_running_loop()
        connection.idle_since = loop.time()
        idle.append(connection)
        if self._sweeper is None:
            self._sweeper = loop.create_task(self._sweep())

    async def _sweep(self) -> None:
        """Close connections idle too long or hung up, until none is left; cancelled
        (the loop is shutting down), close them all."""
        loop = asyncio.get_running_loop()
        try:
            while any(self._idle.values()):
                await asyncio.sleep(self.idle_seconds / 2)
                oldest = loop.time() - self.idle_seconds
                for idle in self._idle.values():
                    expired = [c for c in idle if c.idle_since <= oldest or not c.usable()]
                    for connection in expired:
                        idle.remove(connection)
                        connection.close()
        except asyncio.CancelledError:
            self.close()
            raise
        finally:
            self._sweeper = None


def authority(address: str) -> str:
    """The ``host:port`` of an agent address (``host:port`` or ``scheme://host:port[/...]``):
    what its requests name as Host."""
    return address.rpartition("://")[2].partition("/")[0]


async def _open_tcp(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port, secure = _split(address)
    return await asyncio.open_connection(
        host, port, ssl=ssl.create_default_context() if secure else None
    )


def _split(address: str) -> tuple[str, int, bool]:
    """An agent address -> (host, port, tls)."""
    host, _, port = authority(address).rpartition(":")
    if not host or not port.isdigit():
        raise UpstreamError(f"the agent address {address!r} has no host and port")
    return host.strip("[]"), int(port), address.startswith("https://")


# --- WebSockets ----------------------------------------------------------------------------

# A relayed message may be this large; a bigger one closes the relay (1009).
MAX_WEBSOCKET_MESSAGE: Final = 16 << 20


async def open_websocket(
    uri: str,
    *,
    sock: socket.socket | None = None,
    headers: Sequence[tuple[str, str]] = (),
    subprotocols: Sequence[str] = (),
) -> ClientConnection:
    """The relay's next hop: a WebSocket client connection to ``uri`` (over ``sock`` when
    given), offering the caller's subprotocols. No proxy from the environment, no
    compression of its own (frames go on as they come), no pings (the ends ping)."""
    return await connect(
        uri,
        sock=sock,
        additional_headers=list(headers),
        subprotocols=[Subprotocol(p) for p in subprotocols] or None,
        proxy=None,
        compression=None,
        max_size=MAX_WEBSOCKET_MESSAGE,
        ping_interval=None,
        user_agent_header=None,
    )


async def relay_websocket(
    receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
    send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    upstream: ClientConnection,
) -> None:
    """Relay messages between an accepted ASGI WebSocket and ``upstream``, both ways,
    until either end closes; the close code is passed on."""

    async def from_caller() -> None:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                await upstream.close(message.get("code", 1000))
                return
            if message.get("bytes") is not None:
                await upstream.send(message["bytes"])
            elif message.get("text") is not None:
                await upstream.send(message["text"])

    async def to_caller() -> None:
        with contextlib.suppress(ConnectionClosed):
            async for data in upstream:
                key = "bytes" if isinstance(data, bytes) else "text"
                await send({"type": "websocket.send", key: data})
        with contextlib.suppress(OSError, RuntimeError):  # the caller may be gone already
            await send({"type": "websocket.close", "code": upstream.close_code or 1000})

    tasks = [asyncio.create_task(from_caller()), asyncio.create_task(to_caller())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await upstream.close()

"""The proxy's hop to the agents: HTTP/1.1 over kept-alive connections, bodies streamed.

A relayed request is one exchange: write the request head, stream the body, read the
response head, then hand the body on chunk by chunk as it arrives. Responses are parsed
with ``httptools`` (the C parser uvicorn serves with). httpx did the same job at about
60 % of the proxy's CPU per request (its anyio streams, pool liveness checks and cookie
handling), which alone cost more than the 1 ms the proxy may add.

Connections are kept per agent address. Unlike the reference fleet's per-sandbox relays,
a kept connection here goes to the agent's API, which serves all of its sandboxes, so it
holds no sandbox open. An idle connection is closed after ``idle_seconds`` (well inside
uvicorn's 5 s keep-alive, so an agent does not close one as it is reused), when the agent
hangs up, and when the event loop shuts down (the sweeper task is cancelled then), so
nothing is left open at exit.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Final

import httptools

IDLE_SECONDS: Final = 1.0
MAX_IDLE_PER_AGENT: Final = 32
READ_SIZE: Final = 1 << 16


class UpstreamError(Exception):
    """The agent could not be reached, or broke off before or while answering."""


class _Parsed:
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


class _Connection:
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

    def __init__(self, connection: _Connection, parsed: _Parsed, head_only: bool) -> None:
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


class Upstream:
    """Kept-alive HTTP/1.1 connections to the agents, for one event loop."""

    def __init__(
        self,
        connect_timeout: float,
        idle_seconds: float = IDLE_SECONDS,
        max_idle_per_agent: int = MAX_IDLE_PER_AGENT,
        on_connect: Callable[[], None] = lambda: None,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.idle_seconds = idle_seconds
        self.max_idle_per_agent = max_idle_per_agent
        self._idle: dict[str, list[_Connection]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._on_connect = on_connect

    @asynccontextmanager
    async def exchange(
        self,
        address: str,
        head: bytes,
        body: AsyncIterator[bytes] | None,
        *,
        chunked: bool = False,
        head_only: bool = False,
    ) -> AsyncIterator[Response]:
        """Send ``head`` (a whole request head) and ``body`` to the agent at ``address``
        (``host:port``, or an ``http(s)://`` URL); yields the response once its head is
        in. ``chunked`` frames the body in chunks (the head must say so). Raises
        :class:`UpstreamError` when the agent cannot be reached or does not answer;
        exceptions from ``body`` propagate."""
        connection = self._take(address) or await self._connect(address)
        response: Response | None = None
        try:
            await _send(connection.writer, head, body, chunked)
            parsed = _Parsed()
            while not parsed.head_done:
                parsed.feed(await connection.read())
            response = Response(connection, parsed, head_only)
            yield response
        finally:
            if response is not None and response.reusable():
                self._put(connection)
            else:
                connection.close()

    def close(self) -> None:
        """Close every idle connection (one in use closes when its exchange ends)."""
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()

    async def _connect(self, address: str) -> _Connection:
        host, port, secure = _split(address)
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=ssl.create_default_context() if secure else None
                )
        except (OSError, TimeoutError) as error:
            raise UpstreamError(f"cannot connect to {address}: {error or 'timed out'}") from None
        self._on_connect()
        return _Connection(address, reader, writer)

    def _take(self, key: str) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()  # the most recently used: the least likely to expire
            if connection.usable():
                return connection
            connection.close()
        return None

    def _put(self, connection: _Connection) -> None:
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


async def _send(
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


def authority(address: str) -> str:
    """The ``host:port`` of an agent address (``host:port`` or ``scheme://host:port[/...]``):
    what its requests name as Host."""
    return address.rpartition("://")[2].partition("/")[0]


def _split(address: str) -> tuple[str, int, bool]:
    """An agent address -> (host, port, tls)."""
    host, _, port = authority(address).rpartition(":")
    if not host or not port.isdigit():
        raise UpstreamError(f"the agent address {address!r} has no host and port")
    return host.strip("[]"), int(port), address.startswith("https://")

"""Exchanges over kept-alive HTTP/1.1 connections, one pool per event loop.

A connection goes back to the pool only after an exchange whose response was read to its
end, came alone and did not ask to close (``response.py``), with no byte left unread;
one that receives anything while idle closes itself (``connection.py``). So a request
never reads what a server sent for another one.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Final

from sandboxctl.relay.connection import (
    Connection,
    Unreachable,
    UpstreamError,
    WatchedReader,
    open_stream,
    os_error_text,
)
from sandboxctl.relay.response import Response, read_response

Opener = Callable[[str], Awaitable[tuple[WatchedReader, asyncio.StreamWriter]]]
IDLE_SECONDS: Final = 1.0
MAX_IDLE_PER_AGENT: Final = 32


async def exchange_on(
    connection: Connection,
    head: bytes,
    body: AsyncIterator[bytes] | None,
    chunked: bool = False,
) -> Response:
    """Send ``head`` (a whole request head) and ``body`` on ``connection``; the response
    once its final head is in. Raises :class:`UpstreamError`; exceptions from ``body``
    propagate."""
    await send_request(connection.writer, head, body, chunked)
    return await read_response(connection, head.partition(b" ")[0])


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
        raise UpstreamError(f"sending the request failed: {os_error_text(error)}") from None


class Upstream:
    """Kept-alive HTTP/1.1 connections to servers, by key, for one event loop."""

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
        connection: Connection | None = None,
    ) -> AsyncIterator[Response]:
        """Send ``head`` (a whole request head) and ``body`` to the server at ``address``
        (a key of this pool); yields the response once its final head is in. ``chunked``
        frames the body in chunks (the head must say so). Raises :class:`UpstreamError`
        when the server cannot be reached or does not answer; exceptions from ``body``
        propagate. ``connection`` (from :meth:`connect`) is used instead of taking one."""
        if connection is None:
            connection = await self.connect(address)
        response: Response | None = None
        try:
            response = await exchange_on(connection, head, body, chunked)
            yield response
        finally:
            if response is not None and response.reusable():
                self._put(connection)
            else:
                connection.close()

    async def connect(self, address: str) -> Connection:
        """A kept-alive connection to ``address``, or a new one (:class:`Unreachable`
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
            raise Unreachable(f"cannot connect: {os_error_text(error)}") from None
        self._on_connect()
        return Connection(address, reader, writer)

    def _take(self, key: str) -> Connection | None:
        idle = self._idle.get(key)
        found = None
        while idle and found is None:
            connection = idle.pop()  # the most recently used: the least likely to expire
            if connection.usable():
                connection.set_idle(False)
                found = connection
            else:
                connection.close()
        if idle is not None and not idle:
            del self._idle[key]  # keys come and go with sandboxes and their ports
        return found

    def _put(self, connection: Connection) -> None:
        idle = self._idle.setdefault(connection.key, [])
        if len(idle) >= self.max_idle_per_agent:
            connection.close()
            return
        loop = asyncio.get_running_loop()
        connection.idle_since = loop.time()
        connection.set_idle(True)
        idle.append(connection)
        if self._sweeper is None:
            self._sweeper = loop.create_task(self._sweep())

    async def _sweep(self) -> None:
        """Close connections idle too long or hung up, until none is left; cancelled
        (the loop is shutting down), close them all. It looks only after a sleep: a
        connection put back is usually taken again at once, and a sweeper that looked
        first would end and be made anew for every request."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                await asyncio.sleep(self.idle_seconds / 2)
                if not any(self._idle.values()):
                    return
                oldest = loop.time() - self.idle_seconds
                for key, idle in list(self._idle.items()):
                    expired = [c for c in idle if c.idle_since <= oldest or not c.usable()]
                    for connection in expired:
                        idle.remove(connection)
                        connection.close()
                    if not idle:
                        del self._idle[key]
        except asyncio.CancelledError:
            self.close()
            raise
        finally:
            self._sweeper = None


def authority(address: str) -> str:
    """The ``host:port`` of an agent address (``host:port`` or ``scheme://host:port[/...]``):
    what its requests name as Host."""
    return address.rpartition("://")[2].partition("/")[0]


async def _open_tcp(address: str) -> tuple[WatchedReader, asyncio.StreamWriter]:
    host, port, secure = _split(address)
    return await open_stream(
        host=host, port=port, ssl=ssl.create_default_context() if secure else None
    )


def _split(address: str) -> tuple[str, int, bool]:
    """An agent address -> (host, port, tls)."""
    host, _, port = authority(address).rpartition(":")
    if not host or not port.isdigit():
        raise UpstreamError(f"the agent address {address!r} has no host and port")
    return host.strip("[]"), int(port), address.startswith("https://")

"""A loopback HTTP/1.1 server for the relay's tests that answers each request with
whatever bytes its script writes, well-formed or not, and records what it saw: the
requests, the connections it accepted, and those the relay closed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httptools

from sandboxctl.relay import Upstream


@dataclass
class Seen:
    method: bytes
    url: bytes
    headers: dict[bytes, bytes]
    body: bytes
    connection: int  # which accepted connection carried it, from 1


Answer = Callable[[Seen, asyncio.StreamWriter], Awaitable[bool]]  # -> keep the connection


@dataclass
class RawServer:
    answer: Answer
    requests: list[Seen] = field(default_factory=list)
    connections: int = 0
    closed_by_peer: int = 0  # connections the relay closed while the server kept them
    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    server: asyncio.Server | None = None

    @property
    def address(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        self.writers.append(writer)
        try:
            while True:
                seen = await _read_request(reader, number)
                if seen is None:
                    self.closed_by_peer += 1
                    return
                self.requests.append(seen)
                if not await self.answer(seen, writer):
                    return
        except ConnectionError:
            self.closed_by_peer += 1
        finally:
            writer.close()


async def _read_request(reader: asyncio.StreamReader, connection: int) -> Seen | None:
    class Callbacks:
        def __init__(self) -> None:
            self.url = b""
            self.headers: dict[bytes, bytes] = {}
            self.body = b""
            self.done = False

        def on_url(self, url: bytes) -> None:
            self.url += url

        def on_header(self, name: bytes, value: bytes) -> None:
            self.headers[name.lower()] = value

        def on_body(self, body: bytes) -> None:
            self.body += body

        def on_message_complete(self) -> None:
            self.done = True

    callbacks = Callbacks()
    parser = httptools.HttpRequestParser(callbacks)
    while not callbacks.done:
        data = await reader.read(65536)
        if not data:
            return None
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # CONNECT, or an upgrade: the head is all
            break
    return Seen(parser.get_method(), callbacks.url, callbacks.headers, callbacks.body, connection)


def reply(body: bytes = b"ok", *, extra: bytes = b"", status: int = 200) -> Answer:
    """Answer every request with ``body`` (none to a HEAD) and a Content-Length."""

    async def answer(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        head = b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n%b\r\n" % (status, len(body), extra)
        writer.write(head + (b"" if seen.method == b"HEAD" else body))
        await writer.drain()
        return b"close" not in extra

    return answer


def scripted(*answers: bytes) -> Answer:
    """Answer the first request with the first bytes, the second with the second, and so
    on (the last ones again after that), keeping the connection."""
    count = 0

    async def answer(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        nonlocal count
        count += 1
        writer.write(answers[min(count, len(answers)) - 1])
        await writer.drain()
        return True

    return answer


def head(method: str = "GET", path: str = "/", extra: str = "") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nhost: agent\r\n{extra}\r\n".encode()


async def gather(upstream: Upstream, address: str, request: bytes) -> bytes:
    async with upstream.exchange(address, request, None) as response:
        return b"".join([chunk async for chunk, _ in response.body()])


async def until(check: Callable[[], bool], what: str, seconds: float = 5) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def dribble(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Write ``data`` a byte at a time, letting the loop run between bytes: the reader
    meets every boundary a response can be split at."""
    for index in range(len(data)):
        writer.write(data[index : index + 1])
        await writer.drain()
        await asyncio.sleep(0)

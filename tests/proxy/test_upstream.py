"""The proxy's hop to the agents (sandboxctl/proxy/upstream.py) against a scripted HTTP
server on loopback: framing both ways, keep-alive and its limits, failures."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import httptools
import pytest

from sandboxctl.proxy.upstream import Upstream, UpstreamError


@dataclass
class Seen:
    method: bytes
    url: bytes
    headers: dict[bytes, bytes]
    body: bytes


Answer = Callable[[Seen, asyncio.StreamWriter], Awaitable[bool]]  # -> keep the connection


@dataclass
class Agent:
    """A loopback HTTP/1.1 server that records each request and answers as scripted."""

    answer: Answer
    requests: list[Seen] = field(default_factory=list)
    connections: int = 0
    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    server: asyncio.Server | None = None

    @property
    def address(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> Agent:
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
        self.writers.append(writer)
        try:
            while True:
                seen = await _read_request(reader)
                if seen is None:
                    return
                self.requests.append(seen)
                if not await self.answer(seen, writer):
                    return
        finally:
            writer.close()


async def _read_request(reader: asyncio.StreamReader) -> Seen | None:
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
        parser.feed_data(data)
    return Seen(parser.get_method(), callbacks.url, callbacks.headers, callbacks.body)


def reply(body: bytes = b"ok", *, extra: bytes = b"", status: int = 200) -> Answer:
    async def answer(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        head = b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n%b\r\n" % (status, len(body), extra)
        writer.write(head + (b"" if seen.method == b"HEAD" else body))
        await writer.drain()
        return b"close" not in extra

    return answer


def head(method: str = "GET", path: str = "/", extra: str = "") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nhost: agent\r\n{extra}\r\n".encode()


async def gather(upstream: Upstream, address: str, request: bytes, **options: object) -> bytes:
    async with upstream.exchange(address, request, None, **options) as response:  # type: ignore[arg-type]
        return b"".join([chunk async for chunk, _ in response.body()])


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


def test_a_kept_connection_carries_the_next_request() -> None:
    async def scenario() -> None:
        opened: list[int] = []
        upstream = Upstream(5, on_connect=lambda: opened.append(1))
        async with Agent(reply(b"hello")) as agent:
            for _ in range(3):
                assert await gather(upstream, agent.address, head()) == b"hello"
            assert agent.connections == 1
            assert len(opened) == 1
            upstream.close()

    run(scenario)


def test_a_fixed_length_body_goes_as_is_and_a_chunked_one_in_chunks() -> None:
    async def body() -> AsyncIterator[bytes]:
        for part in (b"one ", b"two ", b"three"):
            yield part

    async def scenario() -> None:
        upstream = Upstream(5)
        async with Agent(reply()) as agent:
            fixed = head("POST", "/f", "content-length: 13\r\n")
            async with upstream.exchange(agent.address, fixed, body()) as response:
                assert response.status == 200
            chunked = head("POST", "/c", "transfer-encoding: chunked\r\n")
            async with upstream.exchange(agent.address, chunked, body(), chunked=True):
                pass
            assert [(s.url, s.body) for s in agent.requests] == [
                (b"/f", b"one two three"),
                (b"/c", b"one two three"),
            ]
            assert b"transfer-encoding" in agent.requests[1].headers
            upstream.close()

    run(scenario)


def test_a_streamed_body_arrives_in_pieces_and_the_last_one_says_so() -> None:
    release = asyncio.Event()

    async def stream(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await release.wait()
        writer.write(b"4\r\nlast\r\n0\r\n\r\n")
        await writer.drain()
        return True

    async def scenario() -> None:
        upstream = Upstream(5)
        async with Agent(stream) as agent:
            async with upstream.exchange(agent.address, head(), None) as response:
                pieces = response.body()
                assert await anext(pieces) == (b"first", False)  # before the rest exists
                release.set()
                assert await anext(pieces) == (b"last", True)
                assert [p async for p in pieces] == []
                assert (b"transfer-encoding", b"chunked") in response.headers
            upstream.close()

    run(scenario)


def test_an_agent_breaking_off_mid_body_is_an_upstream_error() -> None:
    async def cut(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part")
        await writer.drain()
        return False  # closes the connection

    async def scenario() -> None:
        upstream = Upstream(5)
        async with Agent(cut) as agent:
            async with upstream.exchange(agent.address, head(), None) as response:
                pieces = response.body()
                assert await anext(pieces) == (b"only part", False)
                with pytest.raises(UpstreamError, match="closed the connection"):
                    await anext(pieces)
            assert upstream._idle.get(agent.address, []) == []  # never reused

    run(scenario)


def test_an_agent_that_answers_nothing_or_is_not_there() -> None:
    async def silent(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        return False

    async def scenario() -> None:
        upstream = Upstream(5)
        async with Agent(silent) as agent:
            with pytest.raises(UpstreamError, match="closed the connection"):
                await gather(upstream, agent.address, head())
            address = agent.address
        with pytest.raises(UpstreamError, match="cannot connect"):
            await gather(upstream, address, head())
        with pytest.raises(UpstreamError, match="no host and port"):
            await gather(upstream, "agent-without-port", head())

    run(scenario)


def test_a_garbled_answer_is_an_upstream_error() -> None:
    async def garbled(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"SMTP ready\r\n\r\n")
        await writer.drain()
        return False

    async def scenario() -> None:
        async with Agent(garbled) as agent:
            with pytest.raises(UpstreamError, match="does not parse"):
                await gather(Upstream(5), agent.address, head())

    run(scenario)


@pytest.mark.parametrize(
    ("extra", "method"),
    [
        (b"connection: close\r\n", "GET"),  # the agent asked to close
        (b"", "HEAD"),  # the parser cannot tell where a HEAD answer ends
    ],
)
def test_connections_that_cannot_be_reused_are_not(extra: bytes, method: str) -> None:
    async def scenario() -> None:
        upstream = Upstream(5)
        async with Agent(reply(b"body", extra=extra)) as agent:
            for _ in range(2):
                got = await gather(
                    upstream, agent.address, head(method), head_only=method == "HEAD"
                )
                assert got == (b"" if method == "HEAD" else b"body")
            assert agent.connections == 2
            assert agent.requests[0].method == method.encode()

    run(scenario)


def test_a_body_not_read_to_the_end_closes_the_connection() -> None:
    async def scenario() -> None:
        upstream = Upstream(5)
        async with Agent(reply(b"x" * 200_000)) as agent:
            async with upstream.exchange(agent.address, head(), None) as response:
                await anext(response.body())  # a caller that hung up after one piece
            await gather(upstream, agent.address, head())
            assert agent.connections == 2

    run(scenario)


def test_idle_connections_expire_and_a_hung_up_one_is_not_reused() -> None:
    async def scenario() -> None:
        upstream = Upstream(5, idle_seconds=0.05)
        async with Agent(reply()) as agent:
            await gather(upstream, agent.address, head())
            await _until(
                lambda: not upstream._idle.get(agent.address), "the idle connection to expire"
            )
            await gather(upstream, agent.address, head())
            assert agent.connections == 2

            upstream.idle_seconds = 60
            await gather(upstream, agent.address, head())
            for writer in agent.writers:
                writer.close()  # the agent hangs up its idle connections
            await _until(lambda: not upstream._idle[agent.address][0].usable(), "the hang-up")
            await gather(upstream, agent.address, head())
            assert agent.connections == 3
            upstream.close()

    run(scenario)


def test_idle_connections_are_closed_when_the_loop_shuts_down() -> None:
    kept: list[asyncio.StreamWriter] = []

    async def scenario() -> None:
        upstream = Upstream(5, idle_seconds=3600)
        async with Agent(reply()) as agent:
            await gather(upstream, agent.address, head())
            kept.extend(c.writer for c in upstream._idle[agent.address])
        # No close(): asyncio.run cancels the sweeper, which closes what it keeps.

    run(scenario)
    assert len(kept) == 1
    assert kept[0].transport.is_closing()


async def _until(check: Callable[[], bool], what: str, seconds: float = 5) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)

"""The proxy's hop to the agents (sandboxctl/proxy/upstream.py) against a scripted HTTP
server on loopback: framing both ways, keep-alive and its limits, failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from sandboxctl.proxy.upstream import Upstream, UpstreamError
from tests.proxy.raw_http import RawServer as Agent
from tests.proxy.raw_http import Seen, gather, head, reply, until


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
            with pytest.raises(UpstreamError, match="does not start with a status line"):
                await gather(Upstream(5), agent.address, head())

    run(scenario)


def test_a_connection_the_server_asked_to_close_is_not_reused() -> None:
    async def scenario() -> None:
        upstream = Upstream(5)
        async with Agent(reply(b"body", extra=b"connection: close\r\n")) as agent:
            for _ in range(2):
                assert await gather(upstream, agent.address, head()) == b"body"
            assert agent.connections == 2

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
            # Expired, its key goes too: keys come and go with sandboxes and their ports.
            await until(lambda: agent.address not in upstream._idle, "the idle one to expire")
            await gather(upstream, agent.address, head())
            assert agent.connections == 2

            upstream.idle_seconds = 60
            await gather(upstream, agent.address, head())
            for writer in agent.writers:
                writer.close()  # the agent hangs up its idle connections
            await until(lambda: not upstream._idle[agent.address][0].usable(), "the hang-up")
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

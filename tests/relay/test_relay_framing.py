"""The relay as a strict HTTP/1.1 intermediary (``sandboxctl/relay``), against a raw
server on loopback that answers as a hostile one would: interim answers, 101, extra
bytes with a response or on an idle connection, bodies without a length or cut short,
and heads that are not HTTP/1.1. Whatever it sends, a request gets one response, and a
connection that carried anything odd is never used again."""

from __future__ import annotations

import asyncio
import hashlib
import tracemalloc
from collections.abc import Awaitable, Callable

import pytest

from sandboxctl.relay import Upstream, UpstreamError
from tests.proxy.raw_http import Answer, RawServer, Seen, dribble, gather, head, scripted, until

REAL = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nreal"
FORGED = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 6\r\n\r\nforged"


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    """Run ``scenario``; a relay that waits for bytes that never come fails it."""
    asyncio.run(asyncio.wait_for(scenario(), timeout=30))


def written(answer: bytes, dribbled: bool) -> Answer:
    """The first request gets ``answer`` (whole, or a byte at a time), later ones REAL."""

    async def respond(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        if seen.connection == 1 and seen.url == b"/first":
            await (dribble(writer, answer) if dribbled else _write(writer, answer))
        else:
            await _write(writer, REAL)
        return True

    return respond


async def _write(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(data)
    await writer.drain()


async def body_of(upstream: Upstream, address: str, request: bytes) -> bytes:
    async with upstream.exchange(address, request, None) as response:
        return b"".join([chunk async for chunk, _ in response.body()])


# --- the attack: a complete response followed by an interim one ----------------------------


@pytest.mark.parametrize("dribbled", [False, True], ids=["one write", "byte by byte"])
def test_a_response_then_a_100_continue_is_that_response_alone(dribbled: bool) -> None:
    # What a sandbox's server sent to desynchronise the fleet: a whole response whose
    # body is a forged response, then "100 Continue". The relay once passed on a 100
    # with that body, which the next hop took as a response and its body as the next.
    answer = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%b" % (len(FORGED), FORGED)
    answer += b"HTTP/1.1 100 Continue\r\n\r\n"

    async def scenario() -> None:
        upstream = Upstream(5)
        async with RawServer(written(answer, dribbled)) as server:
            async with upstream.exchange(server.address, head(path="/first"), None) as response:
                assert response.status == 200
                assert response.headers == [(b"content-length", b"%d" % len(FORGED))]
                assert b"".join([c async for c, _ in response.body()]) == FORGED
            assert await gather(upstream, server.address, head()) == b"real"
            assert server.connections == 2  # the connection that carried the 100 was closed
            upstream.close()

    run(scenario)


@pytest.mark.parametrize("dribbled", [False, True], ids=["one write", "byte by byte"])
def test_interim_responses_are_dropped_and_the_final_one_relayed(dribbled: bool) -> None:
    answer = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n"
        b"HTTP/1.1 102 Processing\r\n\r\n"
        b"HTTP/1.1 201 Created\r\ncontent-length: 4\r\nx-final: yes\r\n\r\ndone"
    )

    async def scenario() -> None:
        upstream = Upstream(5)
        async with RawServer(written(answer, dribbled)) as server:
            async with upstream.exchange(server.address, head(path="/first"), None) as response:
                assert response.status == 201
                assert response.headers == [(b"content-length", b"4"), (b"x-final", b"yes")]
                assert b"".join([c async for c, _ in response.body()]) == b"done"
            assert await gather(upstream, server.address, head()) == b"real"
            assert server.connections == 2  # interim answers unasked: not reused
            upstream.close()

    run(scenario)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\nxyz",
        b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
    ],
    ids=["with Upgrade", "bare"],
)
def test_a_101_nobody_asked_for_is_refused_and_its_connection_closed(answer: bytes) -> None:
    async def scenario() -> None:
        upstream = Upstream(5)
        async with RawServer(written(answer, False)) as server:
            with pytest.raises(UpstreamError, match=r"switched protocols \(101\)"):
                await gather(upstream, server.address, head(path="/first"))
            await until(lambda: server.closed_by_peer == 1, "the relay to close the connection")
            assert await gather(upstream, server.address, head()) == b"real"
            upstream.close()

    run(scenario)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 600 Beyond\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 999 Beyond\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 099 Below\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/2.0 200 OK\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/0.9 200 OK\r\ncontent-length: 0\r\n\r\n",
        b"\r\nHTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * (70 << 10) + b"\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n",  # no end of head
    ],
    ids=["600", "999", "099", "HTTP/2.0", "HTTP/0.9", "leading CRLF", "70 KiB head", "no end"],
)
def test_what_is_not_one_http_1_1_final_response_is_refused(answer: bytes) -> None:
    async def respond(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        await _write(writer, answer)
        return False  # then close: a head that never ends is cut

    async def scenario() -> None:
        async with RawServer(respond) as server:
            with pytest.raises(UpstreamError):
                await gather(Upstream(5), server.address, head())

    run(scenario)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nx-a: one\rtwo\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nx-a: one\x00two\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nx-a: one\x7ftwo\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nx-a: one\r\n set-cookie: x=1\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nx a: one\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nx-a: one\ninjected: yes\r\ncontent-length: 0\r\n\r\n",
    ],
    ids=["CR", "NUL", "DEL", "obs-fold", "space in name", "bare LF"],
)
def test_header_names_and_values_that_could_inject_headers_are_refused(answer: bytes) -> None:
    async def scenario() -> None:
        async with RawServer(written(answer, False)) as server:
            with pytest.raises(UpstreamError, match=r"does not parse|invalid header"):
                await gather(Upstream(5), server.address, head(path="/first"))

    run(scenario)


# --- where a response ends -----------------------------------------------------------------

ENDINGS = {
    "content-length": ("GET", b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", b"ok"),
    "chunked": (
        "GET",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        b"ok",
    ),
    "chunked, trailers": (
        "GET",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nx-t: 1\r\n\r\n",
        b"ok",
    ),
    "204": ("GET", b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n", b""),
    "304": ("GET", b"HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n", b""),
    "HEAD": ("HEAD", b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n", b""),
}


@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.parametrize(
    "extra", [b"\r\n", b"x", FORGED], ids=["CRLF", "a byte", "a forged response"]
)
def test_bytes_after_a_complete_response_close_its_connection(ending: str, extra: bytes) -> None:
    method, answer, expected = ENDINGS[ending]

    async def scenario() -> None:
        upstream = Upstream(5)
        async with RawServer(written(answer + extra, False)) as server:
            body = await body_of(upstream, server.address, head(method, "/first"))
            assert body == expected
            assert await gather(upstream, server.address, head()) == b"real"
            assert server.connections == 2
            upstream.close()

    run(scenario)


@pytest.mark.parametrize("ending", ENDINGS)
def test_a_response_that_ends_cleanly_leaves_its_connection_reusable(ending: str) -> None:
    # The other side of the test above: the same answers alone keep the connection, so
    # the one above fails for the extra bytes, not for the answer. HEAD, 204 and 304
    # end with their head whatever their Content-Length says.
    method, answer, expected = ENDINGS[ending]

    async def scenario() -> None:
        upstream = Upstream(5)
        async with RawServer(written(answer, True)) as server:
            body = await body_of(upstream, server.address, head(method, "/first"))
            assert body == expected
            assert await gather(upstream, server.address, head()) == b"real"
            assert server.connections == 1
            upstream.close()

    run(scenario)


@pytest.mark.parametrize("extra", [b"\r\n", FORGED], ids=["CRLF", "a forged response"])
def test_bytes_arriving_on_an_idle_connection_close_it(extra: bytes) -> None:
    poke = asyncio.Event()

    async def respond(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        if seen.url == b"/first":
            await _write(writer, b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await poke.wait()  # sent while the connection sits in the pool
            await _write(writer, extra)
        else:
            await _write(writer, REAL)
        return True

    async def scenario() -> None:
        upstream = Upstream(5, idle_seconds=3600)  # no expiry: only the bytes close it
        async with RawServer(respond) as server:
            assert await gather(upstream, server.address, head(path="/first")) == b"ok"
            poke.set()
            await until(lambda: server.closed_by_peer == 1, "the relay to close it")
            assert await gather(upstream, server.address, head()) == b"real"
            assert server.connections == 2
            upstream.close()

    run(scenario)


def test_trailers_are_not_taken_for_headers() -> None:
    answer = (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        b"2\r\nok\r\n0\r\nset-cookie: session=forged\r\n\r\n"
    )

    async def scenario() -> None:
        async with (
            RawServer(written(answer, False)) as server,
            Upstream(5).exchange(server.address, head(path="/first"), None) as response,
        ):
            assert [c async for c, _ in response.body()][-1] == b"ok"
            assert response.headers == [(b"transfer-encoding", b"chunked")]

    run(scenario)


def test_a_trailer_line_without_end_is_not_gathered() -> None:
    """After the last chunk, a trailer line the server never ends: httptools would join
    it in memory (a copy of all of it per read, on the event loop) had the relay asked
    for headers there. It reads it as it comes and keeps nothing."""
    endless = 32 << 20

    async def respond(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nx-t: ")
        for _ in range(endless >> 16):
            writer.write(b"a" * (1 << 16))
            await writer.drain()
        return False  # then close: the body never ended

    async def scenario() -> None:
        async with RawServer(respond) as server:
            tracemalloc.start()
            try:
                with pytest.raises(UpstreamError, match="closed the connection before"):
                    await gather(Upstream(5), server.address, head())
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
        assert peak < endless // 8

    run(scenario)


@pytest.mark.parametrize(
    "framing",
    [
        b"HTTP/1.1 200 OK\r\n\r\n",
        b"HTTP/1.0 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n",
    ],
    ids=["HTTP/1.1", "HTTP/1.0", "connection close"],
)
def test_a_body_without_a_length_is_read_to_the_close_byte_for_byte(framing: bytes) -> None:
    content = b"".join(hashlib.sha256(b"%d" % i).digest() for i in range((10 << 20) // 32))

    async def respond(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        if seen.url != b"/first":
            await _write(writer, REAL)
            return True
        await _write(writer, framing + content)
        return False  # the close ends the body

    async def scenario() -> None:
        upstream = Upstream(5)
        async with RawServer(respond) as server:
            async with upstream.exchange(server.address, head(path="/first"), None) as response:
                pieces = [piece async for piece in response.body()]
            assert b"".join(chunk for chunk, _ in pieces) == content
            assert [last for _, last in pieces] == [False] * (len(pieces) - 1) + [True]
            assert await gather(upstream, server.address, head()) == b"real"
            assert server.connections == 2
            upstream.close()

    run(scenario)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n10\r\nonly part",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n9\r\nonly part\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n9\r\nonly part\r\nzz\r\n",
    ],
    ids=["short of its length", "mid-chunk", "before the last chunk", "a bad chunk size"],
)
def test_a_body_cut_short_never_ends(answer: bytes) -> None:
    async def respond(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        await _write(writer, answer)
        return False

    async def scenario() -> None:
        upstream = Upstream(5)
        async with RawServer(respond) as server:
            received: list[tuple[bytes, bool]] = []

            async def read_all() -> None:
                async with upstream.exchange(server.address, head(), None) as response:
                    async for piece in response.body():
                        received.append(piece)

            with pytest.raises(UpstreamError, match=r"before the response was complete|parse"):
                await read_all()
            assert b"only part".startswith(b"".join(chunk for chunk, _ in received))
            assert not any(last for _, last in received)  # never an end: a cut stream
            assert upstream._idle.get(server.address, []) == []

    run(scenario)


@pytest.mark.parametrize(
    "codings",
    [
        b"transfer-encoding: gzip\r\n",
        b"transfer-encoding: gzip, chunked\r\n",
        b"transfer-encoding: chunked, chunked\r\n",
        b"transfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n",
        b"transfer-encoding: chunked\r\ncontent-length: 2\r\n",
    ],
    ids=["gzip", "gzip then chunked", "chunked twice", "two headers", "with a length"],
)
def test_only_chunked_alone_frames_a_body(codings: bytes) -> None:
    answer = b"HTTP/1.1 200 OK\r\n" + codings + b"\r\n2\r\nok\r\n0\r\n\r\n"

    async def scenario() -> None:
        async with RawServer(written(answer, False)) as server:
            with pytest.raises(UpstreamError, match=r"transfer coding|does not parse"):
                await gather(Upstream(5), server.address, head(path="/first"))

    run(scenario)


def test_chunked_on_http_1_0_is_refused() -> None:
    answer = b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"

    async def scenario() -> None:
        async with RawServer(scripted(answer)) as server:
            with pytest.raises(UpstreamError, match="transfer coding"):
                await gather(Upstream(5), server.address, head())

    run(scenario)


@pytest.mark.parametrize("status", [b"200 Connection established", b"204 No Content"])
def test_a_tunnel_is_not_relayed(status: bytes) -> None:
    async def scenario() -> None:
        async with RawServer(scripted(b"HTTP/1.1 " + status + b"\r\n\r\n")) as server:
            with pytest.raises(UpstreamError, match="tunnel"):
                await gather(Upstream(5), server.address, head("CONNECT", "/"))

    run(scenario)


def test_a_failed_connect_names_no_pid_and_no_path() -> None:
    # The agent's guest-port pool is keyed by the sandbox init's host pid and opens
    # /proc/PID/ns/net: neither may reach an error text.
    async def no_namespace(key: str) -> object:
        raise FileNotFoundError(2, "No such file or directory", "/proc/4242/ns/net")

    async def refused(key: str) -> object:
        raise ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 8080)")

    async def scenario() -> None:
        for opener in (no_namespace, refused):
            upstream = Upstream(5, opener=opener)  # type: ignore[arg-type]
            with pytest.raises(UpstreamError) as failed:
                await gather(upstream, "4242:8080", head())
            text = str(failed.value)
            assert "4242" not in text, text
            assert "/proc" not in text, text
            assert text.startswith("cannot connect: ")

    run(scenario)

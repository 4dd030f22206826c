"""Read bounds: a slowloris, a stalled body and a flood of connections against the real host
agent (``serve-sandboxd``), started with short bounds (tests/serving/attack.py): what each
bound cuts, and what it must not (a steady slow upload, a request after an idle
keep-alive, a long process stream, an input stream that keeps sending)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from sandboxctl.serving import InBackground, bind
from sandboxctl.serving.bounds import ReadBounds
from tests.envd.wire import STREAM, Envd, envelope, envelopes
from tests.sandboxd.servers import agent_process, free_port, sandboxes_unavailable, wait_until
from tests.serving.attack import (
    BODY,
    BOUND_FLAGS,
    HEAD,
    LIMIT,
    SLACK,
    connect,
    read_response,
    read_until_closed,
    trickle,
)

pytestmark = pytest.mark.skipif(
    sandboxes_unavailable() is not None, reason=str(sandboxes_unavailable())
)

INFO = b"GET /v1/info HTTP/1.1\r\nHost: agent\r\n\r\n"


@pytest.fixture
def start_agent(state_dir: Path, uid_base: int) -> Iterator[Callable[..., str]]:
    """Start ``serve-sandboxd`` in development mode with the short bounds; its address."""
    with contextlib.ExitStack() as stack:

        def start(*extra: str) -> str:
            address = f"127.0.0.1:{free_port()}"
            args = [
                "--listen", address, "--state-dir", str(state_dir / "sd"),
                "--uid-base", str(uid_base), "--destroy-on-exit", *BOUND_FLAGS, *extra,
            ]  # fmt: skip
            stack.enter_context(agent_process(args, address))
            return address

        yield start


def test_a_slowloris_is_closed_within_the_head_bound(start_agent) -> None:  # type: ignore[no-untyped-def]
    """Three times the listener's limit of connections, each sending a header line every
    0.2 s (the review's attack, faster): the ones admitted are answered 408 within the
    head bound, counted from their start, however they trickle; the others are closed at
    once. None is left open."""
    address = start_agent()
    clients = trickle(address, count=3 * LIMIT, interval=0.2, timeout=HEAD + 3 * SLACK)
    assert all(c.closed_after is not None for c in clients), "a trickled connection stayed open"
    admitted = [c for c in clients if c.received]
    refused = [c for c in clients if not c.received]
    assert 0 < len(admitted) <= LIMIT
    assert len(refused) >= 2 * LIMIT
    for client in admitted:
        assert client.received.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
        assert client.lines > 2  # it did trickle, and that did not extend the bound
        assert HEAD - 0.2 <= client.closed_after <= HEAD + SLACK  # type: ignore[operator]
    assert all(c.closed_after < HEAD for c in refused)  # type: ignore[operator]


def test_a_silent_connection_and_an_endless_head_are_closed(start_agent) -> None:  # type: ignore[no-untyped-def]
    address = start_agent()
    with connect(address) as silent:
        answer, after = read_until_closed(silent, HEAD + 2 * SLACK)
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert b"request head not received within 1s" in answer
    assert HEAD - 0.2 <= after <= HEAD + SLACK
    with connect(address) as endless:
        endless.sendall(b"GET /v1/info HTTP/1.1\r\nX-Big: " + b"a" * 70_000)
        answer, _ = read_until_closed(endless, HEAD + 2 * SLACK)
    assert answer.startswith(b"HTTP/1.1 431 ")


def test_a_request_after_an_idle_keep_alive_has_the_whole_bound(start_agent) -> None:  # type: ignore[no-untyped-def]
    """The head bound of a kept-alive connection counts from the next request's first
    byte: idle for twice the bound (within uvicorn's 5 s keep-alive), then a head sent in
    pieces over half of it, is answered."""
    address = start_agent()
    with connect(address) as sock:
        sock.sendall(INFO)
        assert read_response(sock).startswith(b"HTTP/1.1 200 ")
        time.sleep(2 * HEAD)  # the idle keep-alive itself, not a wait for state
        for piece in (INFO[:10], INFO[10:25], INFO[25:]):
            sock.sendall(piece)
            time.sleep(HEAD / 4)
        assert read_response(sock).startswith(b"HTTP/1.1 200 ")


def _put_pools_slowly(address: str, pause: float, stop_after: int | None = None) -> bytes:
    """PUT /v1/pools with its body sent 4 bytes at a time, ``pause`` apart (all of it,
    or ``stop_after`` pieces then nothing); what the agent answered before it closed."""
    body = json.dumps({"pools": []}).encode().ljust(48)
    head = (
        "PUT /v1/pools HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    pieces = [body[i : i + 4] for i in range(0, len(body), 4)][:stop_after]
    with connect(address) as sock:
        sock.sendall(head.encode())
        for piece in pieces:
            time.sleep(pause)
            sock.sendall(piece)
        answer, _ = read_until_closed(sock, BODY + 2 * SLACK)
    return answer


def test_a_steady_slow_upload_is_not_cut(start_agent) -> None:  # type: ignore[no-untyped-def]
    """12 pieces, 0.3 s apart: 3.6 s in all, over both bounds, never idle for one."""
    address = start_agent()
    answer = _put_pools_slowly(address, pause=0.3)
    assert answer.startswith(b"HTTP/1.1 200 "), answer


def test_a_stalled_body_ends_the_connection(start_agent) -> None:  # type: ignore[no-untyped-def]
    address = start_agent()
    started = time.monotonic()
    answer = _put_pools_slowly(address, pause=0.1, stop_after=2)
    assert answer == b""  # closed mid-request: the agent logs the hang-up, answers nothing
    assert time.monotonic() - started <= BODY + 0.2 + SLACK


def test_connections_beyond_the_limit_are_closed_at_once(start_agent) -> None:  # type: ignore[no-untyped-def]
    """The limit's connections busy with steady uploads (a piece every 0.3 s: no bound
    cuts them); more are closed at once, unanswered (a head timeout would answer 408);
    once the uploads end, new connections are served again."""
    address = start_agent()
    stop = threading.Event()
    holders = [connect(address) for _ in range(LIMIT + 4)]

    def upload() -> None:
        for sock in holders:
            sock.sendall(b"PUT /v1/pools HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n")
        while not stop.wait(0.3):
            for sock in holders:
                with contextlib.suppress(OSError):  # one of those beyond the limit: closed
                    sock.sendall(b" ")

    uploading = threading.Thread(target=upload, daemon=True)
    uploading.start()
    try:
        for sock in holders[-4:]:  # beyond the limit, whichever came first
            answer, after = read_until_closed(sock, HEAD)
            assert (answer, after < HEAD) == (b"", True)
        with connect(address) as extra:
            extra.sendall(INFO)
            assert read_until_closed(extra, HEAD)[0] == b""
    finally:
        stop.set()
        uploading.join(timeout=10)
        for sock in holders:
            sock.close()

    def served() -> bool:
        with connect(address) as sock:
            sock.sendall(INFO)
            try:
                return read_response(sock, timeout=5).startswith(b"HTTP/1.1 200 ")
            except (AssertionError, OSError):
                return False

    wait_until(served, timeout=10, what="a connection to be served again")


def test_long_process_streams_and_a_paced_input_stream_outlast_the_bounds(start_agent) -> None:  # type: ignore[no-untyped-def]
    """Only request reads are bounded: a command's output stream open for three head
    bounds is whole; an input stream (StreamInput) that sends a keepalive well within the
    body bound, as the e2b SDK does every 50 s within the default 2 min, is not cut, and
    one that goes silent past the bound is."""
    address = start_agent("--pool", "base=1")
    claim = httpx.post(f"http://{address}/v1/claim", json={"template": "base"}, timeout=30)
    assert claim.status_code == 200, claim.text
    envd = Envd(address, claim.json()["id"], claim.json()["token"])

    result = envd.run(f"sleep {3 * HEAD:g}; echo done")
    assert result["stdout"] == "done\n"
    assert result["end"].get("exitCode", 0) == 0  # proto3 JSON leaves out a zero

    command = envd.background(
        "process.Process/Start",
        {"process": {"cmd": "/bin/bash", "args": ["-c", "cat; echo closed"]}, "stdin": True},
    )
    pid = command.listed()["pid"]

    def paced(silence: float) -> Iterator[bytes]:
        yield envelope({"start": {"process": {"pid": pid}}})
        for _ in range(5):
            time.sleep(BODY / 3)
            yield envelope({"keepalive": {}})
        time.sleep(silence)
        data = base64.b64encode(b"hello\n").decode()
        yield envelope({"data": {"input": {"stdin": data}}})

    headers = envd.headers(**{"content-type": STREAM})
    url = f"{envd.base}/process.Process/StreamInput"
    kept = httpx.post(url, content=paced(silence=0), headers=headers, timeout=30)
    assert kept.status_code == 200, kept.text
    assert envelopes(kept.content)[-1][0] == 2  # the end of the stream, without an error
    assert "error" not in envelopes(kept.content)[-1][1]
    with pytest.raises(httpx.TransportError):
        httpx.post(url, content=paced(silence=BODY + SLACK), headers=headers, timeout=30)

    assert envd.rpc("process.Process/CloseStdin", {"process": {"pid": pid}}).status_code == 200
    _, events = command.result()
    out = b"".join(
        base64.b64decode(m["event"]["data"]["stdout"])
        for _, m in events
        if "data" in m.get("event", {})
    )
    assert out == b"hello\nclosed\n"  # the paced stream's input, not the cut one's


async def _ticking(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    """A response that streams a tick every quarter of the head bound, for four bounds."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    for _ in range(16):
        await send({"type": "http.response.body", "body": b"tick\n", "more_body": True})
        await asyncio.sleep(HEAD / 4)
    await send({"type": "http.response.body", "body": b""})


def test_a_late_pipelined_head_does_not_answer_into_a_streaming_response() -> None:
    """A client that pipelines half a head behind a streaming response loses its
    connection at the head bound, and nothing is written into the response it was
    reading (a 408 there would read as part of the body)."""
    server = InBackground(_ticking, bind("127.0.0.1", 0), ReadBounds(HEAD, BODY, LIMIT))
    try:
        with connect(f"127.0.0.1:{server.port}") as sock:
            sock.sendall(b"GET /ticks HTTP/1.1\r\nHost: a\r\n\r\nGET /next HTTP/1.1\r\nX-Half: ")
            received, after = read_until_closed(sock, 4 * HEAD + 2 * SLACK)
    finally:
        server.close()
    assert received.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"tick" in received
    assert b"408" not in received
    assert HEAD - 0.2 <= after <= HEAD + SLACK


async def _slow_reader(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    """An app that reads a request's body only after three body bounds, then counts it."""
    if scope["type"] != "http":
        return
    await asyncio.sleep(3 * BODY)
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    body = b"%d" % size
    headers = [(b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def test_a_body_the_app_has_not_read_yet_is_not_a_stalled_one() -> None:
    """A large upload the server holds back (its buffer full, the app busy for three
    body bounds) sends nothing meanwhile, through no fault of the client's: not cut."""
    server = InBackground(_slow_reader, bind("127.0.0.1", 0), ReadBounds(HEAD, BODY, LIMIT))
    size = 8 * 1024 * 1024
    try:
        with connect(f"127.0.0.1:{server.port}") as sock:
            head = b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % size
            sending = threading.Thread(target=sock.sendall, args=(head + b"x" * size,))
            sending.start()
            answer = read_response(sock, timeout=3 * BODY + 2 * SLACK)
            sending.join(timeout=10)
    finally:
        server.close()
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert answer.endswith(b"\r\n\r\n%d" % size)


def test_a_blank_line_after_an_answer_starts_the_head_bound(start_agent) -> None:  # type: ignore[no-untyped-def]
    """After a complete exchange, one CRLF (which the parser skips without a word, and
    which stops uvicorn's keep-alive timer) must not hold the connection for ever."""
    address = start_agent()
    with connect(address) as sock:
        sock.sendall(INFO)
        assert read_response(sock).startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"\r\n")
        answer, after = read_until_closed(sock, HEAD + 2 * SLACK)
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert after <= HEAD + SLACK


def test_a_listener_bound_to_every_address_has_one_limit(tmp_path: Path) -> None:
    """A socket on 0.0.0.0 accepts on any loopback address a client picks (127.0.0.2,
    127.0.0.3...): each is still the one listener, with one limit of connections."""

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        headers = [(b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})

    port = free_port()
    served = InBackground(app, bind("0.0.0.0", port), ReadBounds(max_connections=4))
    held = []
    try:
        for n in range(2, 6):
            held.append(connect(f"127.0.0.{n}:{port}"))
            assert _answered(held[-1])
        with connect(f"127.0.0.9:{port}") as beyond:
            answer, after = read_until_closed(beyond, SLACK)
        assert answer == b""  # closed at once, unanswered
        assert after < HEAD
    finally:
        for sock in held:
            sock.close()
        served.close()


def _answered(sock: socket.socket) -> bool:
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    return read_response(sock).startswith(b"HTTP/1.1 200 ")

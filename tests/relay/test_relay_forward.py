"""A relayed response passed on to uvicorn (``relay.forward``), under both of uvicorn's
HTTP/1.1 servers: a small ASGI app relays each request, as the agent's guest ports do,
to a raw server on loopback that answers as a sandbox's server might. The client must
get one well-framed response each time, and uvicorn must log nothing."""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
from collections.abc import Iterator, MutableMapping
from typing import Any

import httpx
import pytest
import uvicorn

from sandboxctl.relay import Upstream, UpstreamError, forward, guest_port_failure
from tests.sandboxd.servers import wait_until

DATE = b"date: Mon, 01 Jan 2024 00:00:00 GMT\r\nserver: guest/1.0\r\n"
BUSYBOX_404 = (
    b"<HTML><HEAD><TITLE>404 Not Found</TITLE></HEAD>\n"
    b"<BODY><H1>404 Not Found</H1>\nThe requested URL was not found\n</BODY></HTML>\n"
)
ANSWERS = {
    "/ok": b"HTTP/1.1 200 OK\r\n" + DATE + b"content-length: 2\r\n\r\nok",
    "/204": b"HTTP/1.1 204 No Content\r\n" + DATE + b"content-length: 5\r\n\r\n",
    "/304": b'HTTP/1.1 304 Not Modified\r\netag: "v1"\r\ncontent-length: 5\r\n\r\n',
    "/head": b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 1000\r\n\r\n",
    # What busybox httpd answers for a missing file: no length, the close ends the body.
    "/busybox": b"HTTP/1.1 404 Not Found\r\nContent-type: text/html\r\n"
    + DATE
    + b"Connection: close\r\n\r\n"
    + BUSYBOX_404,
    "/cut": b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part",
    "/101": b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\nconnection: upgrade\r\n\r\n",
    "/interim": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n"
    b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfinal",
}
CLOSING = {"/busybox", "/cut", "/101"}


class _Guest(socketserver.BaseRequestHandler):
    """Reads request heads and writes the scripted answer for each path."""

    def handle(self) -> None:
        data = b""
        while True:
            while b"\r\n\r\n" not in data:
                more = self.request.recv(65536)
                if not more:
                    return
                data += more
            request, _, data = data.partition(b"\r\n\r\n")
            path = request.split(b" ")[1].decode()
            self.request.sendall(ANSWERS[path])
            if path in CLOSING:
                self.request.shutdown(socket.SHUT_WR)
                return


@pytest.fixture(scope="module")
def guest() -> Iterator[str]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Guest)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def relaying_app(address: str) -> Any:
    pool = Upstream(5)

    async def app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        head = f"{scope['method']} {scope['path']} HTTP/1.1\r\nhost: guest\r\n\r\n".encode()
        started = False

        async def relayed(message: MutableMapping[str, Any]) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            async with pool.exchange(address, head, None) as response:
                await forward(response, relayed)
        except UpstreamError as error:
            if started:
                return  # left unfinished: uvicorn drops the connection
            body = guest_port_failure("sb-0a0a0a0a", 8000, error).encode()
            await send({"type": "http.response.start", "status": 502, "headers": []})
            await send({"type": "http.response.body", "body": body})

    return app


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(params=["httptools", "h11"])
def relay(request: pytest.FixtureRequest, guest: str) -> Iterator[tuple[httpx.Client, Records]]:
    """A client of the relaying app under one of uvicorn's servers, and what uvicorn logs
    at warning and above meanwhile."""
    config = uvicorn.Config(
        relaying_app(guest),
        host="127.0.0.1",
        port=0,
        http=request.param,
        log_level="error",
        lifespan="off",
        loop="asyncio",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), what="uvicorn to listen")
    port = server.servers[0].sockets[0].getsockname()[1]
    records = Records()
    logger = logging.getLogger("uvicorn.error")  # after uvicorn configured its logging
    logger.addHandler(records)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            yield client, records
    finally:
        logger.removeHandler(records)
        server.should_exit = True
        thread.join(timeout=10)


def quiet(records: Records) -> None:
    assert [r.getMessage() for r in records.records] == []


def test_204_and_304_lose_their_content_length_and_carry_no_body(
    relay: tuple[httpx.Client, Records],
) -> None:
    client, records = relay
    for path, status in (("/204", 204), ("/304", 304)):
        response = client.get(path)
        assert response.status_code == status
        assert "content-length" not in response.headers
        assert "transfer-encoding" not in response.headers
        assert response.content == b""
    assert client.get("/304").headers["etag"] == '"v1"'
    assert client.get("/ok").text == "ok"  # the same kept connection: nothing was framed
    quiet(records)


def test_a_head_keeps_its_content_length_and_carries_no_body(
    relay: tuple[httpx.Client, Records],
) -> None:
    client, records = relay
    response = client.head("/head")
    assert response.status_code == 200
    assert response.headers["content-length"] == "1000"
    assert response.content == b""
    assert client.get("/ok").text == "ok"
    quiet(records)


def test_date_and_server_come_once(relay: tuple[httpx.Client, Records]) -> None:
    client, records = relay
    for path in ("/ok", "/204", "/busybox"):
        response = client.get(path)
        assert len(response.headers.get_list("date")) == 1, path
        assert response.headers.get_list("server") == ["uvicorn"], path
    quiet(records)


def test_a_body_ended_by_the_close_arrives_whole(relay: tuple[httpx.Client, Records]) -> None:
    client, records = relay
    response = client.get("/busybox")
    assert response.status_code == 404
    assert response.content == BUSYBOX_404
    assert response.headers["content-type"] == "text/html"
    quiet(records)


def test_a_cut_body_reaches_the_client_as_a_cut_stream(
    relay: tuple[httpx.Client, Records],
) -> None:
    client, _ = relay
    with pytest.raises(httpx.RemoteProtocolError):
        client.get("/cut")
    assert client.get("/ok").text == "ok"


def test_a_101_is_a_502_and_interim_answers_are_dropped(
    relay: tuple[httpx.Client, Records],
) -> None:
    client, records = relay
    refused = client.get("/101")
    assert refused.status_code == 502
    assert refused.text == (
        "port 8000 did not answer with one valid HTTP/1.1 response: "
        "the server switched protocols (101) unasked"
    )
    final = client.get("/interim")
    assert (final.status_code, final.text) == (200, "final")
    assert "link" not in final.headers
    quiet(records)


def test_a_port_nothing_answers_on_is_named_by_its_sandbox_never_a_host_pid() -> None:
    """The agent reaches a guest port by the sandbox's init pid; the caller asked for a
    sandbox (in either spelling of its id) and a port, and is answered in those terms."""
    refused = ConnectionRefusedError(111, "Connection refused", "/proc/3024/ns/net")
    for sandbox_id in ("sb_0a0a0a0a", "sb-0a0a0a0a"):
        assert guest_port_failure(sandbox_id, 8080, refused) == (
            "nothing answers on port 8080 of sandbox sb-0a0a0a0a: cannot connect: "
            "Connection refused"
        )

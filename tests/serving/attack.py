"""Raw loopback sockets as a slow or hostile client drives them, for the read-bound tests."""

from __future__ import annotations

import select
import socket
import ssl
import time
from dataclasses import dataclass, field

HEAD = 1.0  # the bounds the services under attack are started with, in seconds
BODY = 1.0
LIMIT = 16  # connections per listener
# What a loaded 2-core machine may add to a bound before a closed connection is seen.
SLACK = 1.5
BOUND_FLAGS = [
    "--request-head-timeout", f"{HEAD:g}s",
    "--request-body-idle-timeout", f"{BODY:g}s",
    "--max-connections", str(LIMIT),
]  # fmt: skip


REQUEST_LINE = b"GET /metrics HTTP/1.1\r\n"


def connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def read_until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, float]:
    """What the server sends until it closes the connection, and how long that took;
    fails when it is still open after ``timeout``."""
    start = time.monotonic()
    received = b""
    while True:
        left = start + timeout - time.monotonic()
        if left <= 0:
            raise AssertionError(f"still open after {timeout}s, having sent {received!r}")
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return received, time.monotonic() - start
        received += chunk


def read_response(sock: socket.socket, timeout: float = 10) -> bytes:
    """One whole response with a Content-Length body (the agent's JSON answers)."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"closed mid-response: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"closed mid-body: {data!r}")
        body += chunk
    return head + b"\r\n\r\n" + body


@dataclass
class Trickler:
    """A slowloris: connections that each send a request line, then one header line
    every ``interval`` and never the blank line that ends a head."""

    sock: socket.socket
    opened: float
    lines: int = 0
    received: bytes = b""
    closed_after: float | None = None
    sent: list[float] = field(default_factory=list)


def trickle(
    address: str, count: int, interval: float, timeout: float, tls: ssl.SSLContext | None = None
) -> list[Trickler]:
    """Open ``count`` connections and trickle a head on each until every one is closed
    (or ``timeout`` has passed since the first opened): each with when it was closed and
    what it was answered."""
    clients: list[Trickler] = []
    for _ in range(count):
        sock = connect(address)
        if tls is not None:
            sock = tls.wrap_socket(sock, server_hostname="127.0.0.1")
        sock.setblocking(False)
        clients.append(Trickler(sock, time.monotonic()))
    start = clients[0].opened
    while any(c.closed_after is None for c in clients) and time.monotonic() < start + timeout:
        now = time.monotonic()
        for client in clients:
            if client.closed_after is None and (
                not client.sent or now - client.sent[-1] >= interval
            ):
                line = (
                    b"GET /metrics HTTP/1.1\r\n"
                    if not client.sent
                    else b"X-Trickle: %d\r\n" % client.lines
                )
                try:
                    client.sock.send(line)
                    client.lines += 1
                except (BlockingIOError, ssl.SSLWantWriteError):
                    pass
                except OSError:
                    pass  # closed: the read below sees it
                client.sent.append(now)
        open_socks = [c.sock for c in clients if c.closed_after is None]
        readable, _, _ = select.select(open_socks, [], [], 0.05)
        for client in clients:
            if client.sock in readable and client.closed_after is None:
                _read_some(client)
    for client in clients:
        client.sock.close()
    return clients


def _read_some(client: Trickler) -> None:
    try:
        chunk = client.sock.recv(65536)
    except (BlockingIOError, ssl.SSLWantReadError):
        return
    except (ConnectionResetError, ssl.SSLError, BrokenPipeError):
        chunk = b""
    if chunk:
        client.received += chunk
    else:
        client.closed_after = time.monotonic() - client.opened

"""A hostile HTTP server, run inside a sandbox by tests/proxy/test_sdk_relay.py (by the
sandbox's own python3: the standard library only). Each path answers as an attacker's
server would; what happened to its connections is written to STATS, which the test
reads through envd, so that reading it never touches the guest-port connections.

    python3 hostile_server.py PORT [ADDRESS]   (default 127.0.0.1)
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import threading
import time

FORGED = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 6\r\n\r\nforged"
PLAIN = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nplain"
BIG = b"".join(hashlib.sha256(b"%d" % i).digest() for i in range((10 << 20) // 32))
BUSYBOX_404 = (
    b"<HTML><HEAD><TITLE>404 Not Found</TITLE></HEAD>\n"
    b"<BODY><H1>404 Not Found</H1>\nThe requested URL was not found\n</BODY></HTML>\n"
)
STATS = "/tmp/hostile-stats.json"
POKE = "/tmp/hostile-poke"
ANSWERS = {
    # A whole response whose body is a forged response, then an unasked 100 Continue.
    b"/desync": b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%b" % (len(FORGED), FORGED)
    + b"HTTP/1.1 100 Continue\r\n\r\n",
    b"/plain": PLAIN,
    b"/extra": PLAIN + FORGED,
    b"/101": b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\nconnection: upgrade\r\n\r\n",
    b"/204": b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n",
    b"/304": b'HTTP/1.1 304 Not Modified\r\netag: "v1"\r\ncontent-length: 5\r\n\r\n',
    b"/head": b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 1000\r\n\r\n",
    b"/interim": b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n" + PLAIN,
    # Chunks, a chunk extension and a trailer (which is not relayed).
    b"/chunked": b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nx-trailer: t\r\n\r\n",
}
# These end the body by closing the connection (or cut it short).
CLOSING = {
    b"/big": b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
    b"connection: close\r\n\r\n" + BIG,
    b"/busybox": b"HTTP/1.1 404 Not Found\r\nContent-type: text/html\r\n"
    b"Date: Mon, 01 Jan 2024 00:00:00 GMT\r\nServer: busybox\r\nConnection: close\r\n\r\n"
    + BUSYBOX_404,
    b"/http10": b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nended by the close",
    b"/cut": b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n" + b"c" * 500,
    b"/cutchunked": b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n",
}
stats = {"connections": 0, "junk_sent": 0, "closed_after_junk": 0}
lock = threading.Lock()


def publish() -> None:
    with open(STATS + ".new", "w") as out:
        json.dump(stats, out)
    os.replace(STATS + ".new", STATS)


def count(what: str) -> None:
    with lock:
        stats[what] += 1
        publish()


def junk_when_poked(conn: socket.socket, sent: threading.Event) -> None:
    """Once the test touches POKE, write a forged response on a connection whose
    exchange is over: it sits idle in the relay's pool."""
    while not os.path.exists(POKE):
        time.sleep(0.01)
    sent.set()  # before: the relay may close the connection as soon as the bytes land
    conn.sendall(FORGED)
    count("junk_sent")


def more(conn: socket.socket, data: bytes) -> bytes:
    received = conn.recv(65536)
    if not received:
        raise ConnectionError("the relay closed mid-request")
    return data + received


def read_body(conn: socket.socket, head: bytes, data: bytes) -> tuple[bytes, bytes, bytes]:
    """A request body as its head frames it (chunked, with no trailers, or a length):
    how it was framed, the body, and the bytes after it."""
    lowered = head.lower()
    if b"\r\ntransfer-encoding: chunked" in lowered:
        body = b""
        while True:
            while b"\r\n" not in data:
                data = more(conn, data)
            size_line, _, data = data.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            while len(data) < size + 2:
                data = more(conn, data)
            body, data = body + data[:size], data[size + 2 :]
            if not size:
                return b"chunked", body, data
    _, found, rest = lowered.partition(b"\r\ncontent-length:")
    length = int(rest.split(b"\r\n")[0]) if found else 0
    while len(data) < length:
        data = more(conn, data)
    return b"length" if found else b"none", data[:length], data[length:]


def serve(conn: socket.socket, peer: str) -> None:
    count("connections")
    junk = threading.Event()
    data = b""
    with conn:
        while True:
            while b"\r\n\r\n" not in data:
                more = conn.recv(65536)
                if not more:
                    if junk.is_set():
                        count("closed_after_junk")
                    return
                data += more
            head, _, data = data.partition(b"\r\n\r\n")
            path = head.split(b" ")[1]
            if path in CLOSING:
                conn.sendall(CLOSING[path])
                conn.shutdown(socket.SHUT_WR)
                return
            if path == b"/idle":
                conn.sendall(PLAIN)
                threading.Thread(target=junk_when_poked, args=(conn, junk), daemon=True).start()
                continue
            if path == b"/upload":  # how the body came, its length and its digest
                framing, body, data = read_body(conn, head, data)
                said = b"%s %d %s" % (framing, len(body), hashlib.sha256(body).hexdigest().encode())
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%b" % (len(said), said))
                continue
            if path == b"/head-as-received":  # the request's head, as it came
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%b" % (len(head), head))
                continue
            if path.startswith(b"/echo"):  # the request line's target, as it came
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%b" % (len(path), path))
                continue
            if path == b"/peer":  # who asked: the agent (127.0.0.1) or the proxy, straight
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%b" % (len(peer), peer.encode())
                )
                continue
            conn.sendall(ANSWERS.get(path, PLAIN))


def main() -> None:
    address = sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1"
    server = socket.create_server((address, int(sys.argv[1])))
    publish()
    while True:
        conn, (peer, _) = server.accept()
        threading.Thread(target=serve, args=(conn, peer), daemon=True).start()


if __name__ == "__main__":
    main()

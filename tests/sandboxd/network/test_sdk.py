"""The network of sandboxes made by the unmodified e2b SDK: NAT to a test host, allow and
deny rules and their live update, and guest ports through the envd proxy
(``get_host``: plain HTTP, a streamed answer, a WebSocket, allowPublicTraffic false)."""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidHandshake

from sandboxctl_testing.nethost import NetHost, net_host
from tests.conftest import process_slot
from tests.proxy.sdk_stack import create_sandbox, sdk_stack, skip_reason

KEY = "e2b_" + "d" * 40
SECRET = b"envd-secret-for-network-sdk-tests"
UID_BASE = 2_800_000 + process_slot() * 20
PORT = 8080
CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), 1.5)\n"
    "    print('open', s.recv(100).decode())\n"
    "except OSError as e:\n"
    "    print('blocked', type(e).__name__)\n"
)
# A guest server: / answers "hello" (and who asked, in X-Peer); /stream sends three lines
# 0.3 s apart, chunked. Bound to BIND: the sandbox's loopback (reached through the agent)
# or every address (reached straight from the proxy, through the sandbox's veth).
GUEST_SERVER = """
import http.server, time
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.path == "/stream":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(3):
                line = b"line %d\\n" % i
                self.wfile.write(b"%x\\r\\n%s\\r\\n" % (len(line), line))
                self.wfile.flush()
                time.sleep(0.3)
            self.wfile.write(b"0\\r\\n\\r\\n")
        else:
            body = b"hello from " + self.headers["Host"].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Peer", self.client_address[0])
            self.end_headers()
            self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("BIND", 8000), H).serve_forever()
"""
LOOPBACK, EVERY_ADDRESS = "127.0.0.1", "0.0.0.0"


@pytest.fixture(scope="module")
def sdk() -> Iterator[dict[str, Any]]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with sdk_stack(
        key=KEY, secret=SECRET, uid_base=UID_BASE, warm=2, prefix="sbnet-", network=True
    ) as params:
        yield params


@pytest.fixture(scope="module")
def testhost() -> Iterator[NetHost]:
    with net_host(extra_addresses=2) as host:
        for address in host.addresses:
            host.serve_tcp(address, PORT)
        yield host


def reach(sandbox: Any, address: str) -> str:
    script = CONNECT.replace("\n", "\\n").replace("'", "\\'")
    command = f"python3 -c $'{script}' {address} {PORT}"
    return str(sandbox.commands.run(command).stdout.strip())


def test_internet_through_nat_and_rules_that_change_live(
    sdk: dict[str, Any], testhost: NetHost
) -> None:
    first, second = testhost.addresses
    online = create_sandbox(sdk, allow_internet_access=True)
    offline = create_sandbox(sdk)
    ruled = create_sandbox(sdk, allow_internet_access=True, network={"deny_out": [f"{first}/32"]})
    try:
        assert reach(online, first) == f"open {testhost.gateway}"  # masqueraded
        assert reach(offline, first).startswith("blocked")
        assert reach(ruled, first).startswith("blocked")
        assert reach(ruled, second).startswith("open")
        ruled.update_network({"allow_out": [first], "deny_out": ["0.0.0.0/0"]})
        assert reach(ruled, first).startswith("open")
        assert reach(ruled, second).startswith("blocked")
        info = ruled.get_info()
        assert info.allow_internet_access is True
    finally:
        for sandbox in (online, offline, ruled):
            sandbox.kill()


def test_a_domain_in_allow_out_is_a_400_naming_the_field(sdk: dict[str, Any]) -> None:
    from e2b import Sandbox
    from e2b.exceptions import SandboxException

    with pytest.raises(SandboxException, match=r"400: network\.allowOut: 'example\.com'"):
        Sandbox.create(network={"allow_out": ["example.com"]}, **sdk)


@pytest.mark.parametrize("bind", [LOOPBACK, EVERY_ADDRESS])
def test_get_host_reaches_a_server_in_the_sandbox(sdk: dict[str, Any], bind: str) -> None:
    sandbox = create_sandbox(sdk)  # no internet: guest ports need none
    try:
        sandbox.files.write("/home/user/server.py", GUEST_SERVER.replace("BIND", bind))
        sandbox.commands.run("python3 /home/user/server.py", background=True)
        host = sandbox.get_host(8000)
        with httpx.Client(base_url=sdk["sandbox_url"], headers={"Host": host}) as client:

            def answered() -> httpx.Response | None:
                try:
                    response = client.get("/")
                except httpx.HTTPError:
                    return None
                return response if response.status_code == 200 else None

            deadline = time.monotonic() + 20
            while (response := answered()) is None and time.monotonic() < deadline:
                time.sleep(0.1)
            assert response is not None
            assert response.text == f"hello from {host}"
            # Through the agent the guest is asked from its own loopback; straight from
            # the proxy, from the sandbox network's gateway. The proxy remembers a refusal
            # (the server was not up yet) for 2 s, so the first answers may be relayed.
            if bind == LOOPBACK:
                assert response.headers["x-peer"] == "127.0.0.1"
            else:
                deadline = time.monotonic() + 10
                while client.get("/").headers["x-peer"] == "127.0.0.1":
                    assert time.monotonic() < deadline, "never reached straight"
                    time.sleep(0.1)
            with client.stream("GET", "/stream") as stream:
                arrivals = []
                for line in stream.iter_lines():
                    arrivals.append((line, time.monotonic()))
            assert [line for line, _ in arrivals] == ["line 0", "line 1", "line 2"]
            assert arrivals[-1][1] - arrivals[0][1] > 0.4  # streamed, not buffered
            # The E2b-Sandbox-Port header routes alike; a port nothing listens on is a 502.
            routed = client.get(
                "/", headers={"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "8000"}
            )
            assert routed.status_code == 200
            started = time.monotonic()
            assert client.get("/", headers={"Host": sandbox.get_host(8001)}).status_code == 502
            assert time.monotonic() - started < 1
    finally:
        sandbox.kill()


def test_python_http_server_in_a_fresh_sandbox_answers_through_get_host(
    sdk: dict[str, Any],
) -> None:
    """``python3 -m http.server`` resolves the sandbox's own name before it listens
    (``socket.getfqdn()``). With no DNS to ask (no internet), that must not wait for a
    resolver: the name is in the sandbox's /etc/hosts, and a query the filter stops is
    refused, not left to time out. RES_OPTIONS makes such a wait 30 s (glibc's longest),
    beyond this test's deadline, where glibc's default would have been 10 s."""
    sandbox = create_sandbox(sdk)  # no internet
    try:
        sandbox.commands.run(
            "python3 -m http.server 8080",
            background=True,
            cwd="/home/user",
            envs={"RES_OPTIONS": "timeout:30 attempts:1"},
        )
        host = sandbox.get_host(8080)
        with httpx.Client(base_url=sdk["sandbox_url"], headers={"Host": host}) as client:
            deadline = time.monotonic() + 20
            while client.get("/").status_code != 200:
                assert time.monotonic() < deadline, "python3 -m http.server never answered"
                time.sleep(0.05)
            assert "Directory listing for /" in client.get("/").text
    finally:
        sandbox.kill()


def test_private_traffic_needs_the_traffic_access_token(sdk: dict[str, Any]) -> None:
    sandbox = create_sandbox(sdk, network={"allow_public_traffic": False})
    try:
        assert sandbox.traffic_access_token
        sandbox.files.write("/home/user/server.py", GUEST_SERVER.replace("BIND", EVERY_ADDRESS))
        sandbox.commands.run("python3 /home/user/server.py", background=True)
        host = {"Host": sandbox.get_host(8000)}
        token = {"E2B-Traffic-Access-Token": sandbox.traffic_access_token}
        with httpx.Client(base_url=sdk["sandbox_url"]) as client:
            deadline = time.monotonic() + 20
            while client.get("/", headers={**host, **token}).status_code != 200:
                assert time.monotonic() < deadline, "the guest server never answered"
                time.sleep(0.1)
            assert client.get("/", headers=host).status_code == 401
            wrong = {"E2B-Traffic-Access-Token": "0" * 64}
            assert client.get("/", headers={**host, **wrong}).status_code == 401
    finally:
        sandbox.kill()


# A WebSocket echo server for the sandbox's own python3 (which has no websockets library):
# the RFC 6455 handshake, then every message back with "echo: " in front.
WS_SERVER = r"""
import base64, hashlib, socket, struct, threading
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
def serve(conn):
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(4096)
    lines = data.decode().split("\r\n")[1:]
    headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines)}
    digest = hashlib.sha1(headers["sec-websocket-key"].encode() + GUID).digest()
    conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                 b"Connection: Upgrade\r\nSec-WebSocket-Accept: "
                 + base64.b64encode(digest) + b"\r\n\r\n")
    stream = conn.makefile("rb")
    while True:
        first, second = stream.read(2)
        opcode, length = first & 15, second & 127
        if length == 126:
            length = struct.unpack(">H", stream.read(2))[0]
        mask = stream.read(4)
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(stream.read(length)))
        if opcode == 8:
            conn.sendall(b"\x88\x02" + (payload[:2] or b"\x03\xe8"))
            return
        reply = b"echo: " + payload
        conn.sendall(bytes([0x80 | opcode, len(reply)]) + reply)
server = socket.create_server(("BIND", 8001))
while True:
    conn, _ = server.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


@pytest.mark.parametrize("bind", [LOOPBACK, EVERY_ADDRESS])
def test_a_websocket_to_a_guest_port_is_relayed_both_ways(sdk: dict[str, Any], bind: str) -> None:
    from websockets.sync.client import connect

    sandbox = create_sandbox(sdk)
    try:
        sandbox.files.write("/home/user/ws.py", WS_SERVER.replace("BIND", bind))
        sandbox.commands.run("python3 /home/user/ws.py", background=True)
        proxy = httpx.URL(sdk["sandbox_url"])
        uri = f"ws://{sandbox.get_host(8001)}/chat?room=1"
        deadline = time.monotonic() + 20
        while True:
            try:
                sock = socket.create_connection((proxy.host, proxy.port))
                websocket = connect(uri, sock=sock, proxy=None, open_timeout=5)
                break
            except (OSError, InvalidHandshake):
                assert time.monotonic() < deadline, "the guest's WebSocket never answered"
                time.sleep(0.2)
        with websocket:
            websocket.send("hi")
            assert websocket.recv(timeout=5) == "echo: hi"
            websocket.send(b"\x00\x01")
            assert websocket.recv(timeout=5) == b"echo: \x00\x01"
    finally:
        sandbox.kill()


HOSTILE = (Path(__file__).parents[2] / "proxy" / "hostile_server.py").read_text()
FORGED = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 6\r\n\r\nforged"


def test_a_hostile_guest_reached_straight_is_checked_as_strictly(sdk: dict[str, Any]) -> None:
    """The proxy's straight path to a guest port checks the guest's answers as the
    agent's relay does (tests/proxy/test_sdk_relay.py attacks that one)."""
    sandbox = create_sandbox(sdk)
    try:
        sandbox.files.write("/home/user/hostile_server.py", HOSTILE)
        sandbox.commands.run("python3 /home/user/hostile_server.py 8000 0.0.0.0", background=True)
        host = {"Host": sandbox.get_host(8000)}
        with httpx.Client(base_url=sdk["sandbox_url"], headers=host, timeout=30) as client:
            # Through the agent the server sees 127.0.0.1; straight, the gateway. A
            # refusal (the server not up yet) is remembered for 2 s.
            deadline = time.monotonic() + 20
            while (peer := client.get("/peer")).status_code != 200 or peer.text == LOOPBACK:
                assert time.monotonic() < deadline, "never reached straight"
                time.sleep(0.1)
            desync = client.get("/desync")
            assert (desync.status_code, desync.content) == (200, FORGED)
            assert client.get("/extra").content == b"plain"
            assert client.get("/plain").content == b"plain"
            switched = client.get("/101")
            assert switched.status_code == 502
            assert switched.json() == {
                "error": "port 8000 did not answer with one valid HTTP/1.1 response: "
                "the server switched protocols (101) unasked"
            }
            empty = client.get("/204")
            assert (empty.status_code, empty.content) == (204, b"")
            assert "content-length" not in empty.headers
            head = client.head("/head")
            assert (head.headers["content-length"], head.content) == ("1000", b"")
            big = client.get("/big")
            expected = b"".join(hashlib.sha256(b"%d" % i).digest() for i in range((10 << 20) // 32))
            assert big.content == expected
            with pytest.raises(httpx.RemoteProtocolError):
                client.get("/cut")
            assert client.get("/peer").text != LOOPBACK  # still straight
    finally:
        sandbox.kill()

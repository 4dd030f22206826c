"""HTTP/1.1 framing through a guest port, on each path an answer takes: straight from
the envd proxy (a server on the sandbox's address, reached through its veth), through the
agent (a server on the sandbox's loopback), and the agent's own guest-port route called
without the proxy. The guest is tests/proxy/hostile_server.py in a real bubblewrap
sandbox with a network; the unmodified e2b SDK made it.

A server that ends its body by closing the connection (busybox httpd's 404: no length,
``Connection: close``) once reached the caller cut short (curl exit 18), with its Date and
Server twice, and the log named an envd relay for a guest port."""

from __future__ import annotations

import hashlib
import logging
import re
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandboxctl.core.ids import SandboxId
from sandboxctl.relay import authority
from sandboxctl.store import SandboxStore
from tests.conftest import process_slot
from tests.proxy.sdk_stack import TOKEN, create_sandbox, sdk_stack_and_store, skip_reason
from tests.sandboxd.servers import wait_until

KEY = "e2b_" + "f" * 40
SECRET = b"envd-secret-for-guest-framing-tests"
UID_BASE = 2_900_000 + process_slot() * 20
SERVER = Path(__file__).with_name("hostile_server.py").read_text()
EVERY_ADDRESS_PORT, LOOPBACK_PORT, NOTHING_PORT = 8000, 8001, 8002
BIG = b"".join(hashlib.sha256(b"%d" % i).digest() for i in range((10 << 20) // 32))
BUSYBOX_404_END = b"</BODY></HTML>\n"
PATHS = ("straight", "through the agent", "the agent's route")


@dataclass
class Guest:
    sandbox: Any
    proxy_url: str
    clients: dict[str, httpx.Client]  # by path
    hosts: dict[str, str]  # the Host a proxy path's client sends


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[dict[str, Any], SandboxStore]]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with sdk_stack_and_store(
        key=KEY, secret=SECRET, uid_base=UID_BASE, warm=1, prefix="sbframe-", network=True
    ) as found:
        yield found


@pytest.fixture(scope="module")
def guest(stack: tuple[dict[str, Any], SandboxStore]) -> Iterator[Guest]:
    sdk, store = stack
    sandbox = create_sandbox(sdk)
    try:
        sandbox.files.write("/home/user/hostile_server.py", SERVER)
        run = "python3 /home/user/hostile_server.py"
        sandbox.commands.run(f"{run} {EVERY_ADDRESS_PORT} 0.0.0.0", background=True)
        sandbox.commands.run(f"{run} {LOOPBACK_PORT} 127.0.0.1", background=True)
        owner = store.owner(SandboxId.parse(sandbox.sandbox_id), lambda: True)
        assert owner is not None
        agent_route = (
            f"http://{authority(owner.address)}/v1/sandboxes/{owner.claim_id}"
            f"/ports/{EVERY_ADDRESS_PORT}"
        )
        hosts = {
            "straight": sandbox.get_host(EVERY_ADDRESS_PORT),
            "through the agent": sandbox.get_host(LOOPBACK_PORT),
        }
        clients = {
            path: httpx.Client(base_url=sdk["sandbox_url"], headers={"Host": host}, timeout=30)
            for path, host in hosts.items()
        }
        clients["the agent's route"] = httpx.Client(
            base_url=agent_route, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        )
        # Straight, the server sees the gateway's address; through the agent, 127.0.0.1.
        # A refusal (the server not up yet) sends the proxy through the agent for 2 s.
        wait_until(
            lambda: _peer(clients["straight"]) not in (None, "127.0.0.1"),
            what="the proxy to reach the guest straight",
        )
        wait_until(
            lambda: _peer(clients["through the agent"]) == "127.0.0.1",
            what="the guest on the sandbox's loopback, through the agent",
        )
        yield Guest(sandbox, sdk["sandbox_url"], clients, hosts)
    finally:
        for client in locals().get("clients", {}).values():
            client.close()
        sandbox.kill()


def _peer(client: httpx.Client) -> str | None:
    answered = client.get("/peer")
    return answered.text if answered.status_code == 200 else None


@pytest.fixture
def logged() -> Iterator[Records]:
    """What sandboxctl's loggers (the proxy's and the agent's, in this process) say."""
    records = Records()
    logger = logging.getLogger("sandboxctl")
    level = logger.level
    logger.addHandler(records)
    logger.setLevel(logging.INFO)
    yield records
    logger.removeHandler(records)
    logger.setLevel(level)


@pytest.fixture
def uvicorn_errors() -> Iterator[Records]:
    """What the proxy's and the agent's uvicorn servers log as errors meanwhile."""
    records = Records()
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(records)
    yield records
    logger.removeHandler(records)


@pytest.mark.parametrize("path", PATHS)
def test_a_10_mib_answer_ended_by_the_close_arrives_byte_exact(guest: Guest, path: str) -> None:
    client = guest.clients[path]
    answered = client.get("/big")
    assert answered.status_code == 200
    assert len(answered.content) == len(BIG)
    assert answered.content == BIG
    # To an HTTP/1.1 caller a body of unknown length ends with the last chunk.
    assert answered.headers["transfer-encoding"] == "chunked"
    old = client.get("/http10")  # an HTTP/1.0 answer: its body always ends with the close
    assert (old.status_code, old.content) == (200, b"ended by the close")


@pytest.mark.parametrize("path", ["straight", "through the agent"])
def test_curl_gets_the_whole_close_delimited_answer(guest: Guest, path: str) -> None:
    """As the finding was seen: curl exited 18 ("transfer closed with outstanding read
    data remaining") on busybox's 404."""
    with tempfile.NamedTemporaryFile() as out:
        for target, expected in (("/busybox", None), ("/big", BIG)):
            host = f"Host: {guest.hosts[path]}"
            done = subprocess.run(
                ["curl", "-sS", "-o", out.name, "-H", host, guest.proxy_url + target],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            body = Path(out.name).read_bytes()
            if expected is None:
                assert body.endswith(BUSYBOX_404_END)
            else:
                assert hashlib.sha256(body).digest() == hashlib.sha256(expected).digest()


@pytest.mark.parametrize("path", PATHS)
def test_the_date_and_server_come_once(guest: Guest, path: str) -> None:
    busybox = guest.clients[path].get("/busybox")
    assert busybox.status_code == 404
    assert busybox.content.endswith(BUSYBOX_404_END)
    assert len(busybox.headers.get_list("date")) == 1
    assert busybox.headers.get_list("server") == ["uvicorn"]


@pytest.mark.parametrize("path", PATHS)
def test_head_204_and_304_have_no_body(guest: Guest, path: str) -> None:
    client = guest.clients[path]
    head = client.head("/head")
    assert (head.status_code, head.content) == (200, b"")
    assert head.headers["content-length"] == "1000"  # what a GET would have
    for target, status in (("/204", 204), ("/304", 304)):
        answered = client.get(target)
        assert (answered.status_code, answered.content) == (status, b"")
        assert "content-length" not in answered.headers
        assert "transfer-encoding" not in answered.headers
    assert client.get("/plain").content == b"plain"  # the connections still serve


@pytest.mark.parametrize("path", PATHS)
def test_chunked_bodies_both_ways(guest: Guest, path: str) -> None:
    client = guest.clients[path]
    answered = client.get("/chunked")
    assert (answered.status_code, answered.content) == (200, b"hello world")
    assert "x-trailer" not in answered.headers  # trailers are not relayed
    payload = BIG[: 3 << 20]

    def pieces() -> Iterator[bytes]:
        for start in range(0, len(payload), 1 << 20):
            yield payload[start : start + (1 << 20)]

    digest = hashlib.sha256(payload).hexdigest()
    chunked = client.post("/upload", content=pieces())  # no length: sent chunked
    assert chunked.text == f"chunked {len(payload)} {digest}"
    counted = client.post("/upload", content=payload)
    assert counted.text == f"length {len(payload)} {digest}"


@pytest.mark.parametrize("path", PATHS)
def test_an_upgrade_other_than_a_websocket_is_not_asked_of_the_guest(
    guest: Guest, path: str
) -> None:
    """The relay never asks to switch protocols (a 101 would be refused): Upgrade and
    Connection are hop-by-hop, so the guest answers the request itself."""
    asked = guest.clients[path].get(
        "/head-as-received",
        headers={"Connection": "Upgrade, HTTP2-Settings", "Upgrade": "h2c", "HTTP2-Settings": ""},
    )
    assert asked.status_code == 200
    lines = asked.content.lower().split(b"\r\n")
    assert lines[0] == b"get /head-as-received http/1.1"
    named = [line.partition(b":")[0] for line in lines[1:]]
    assert not {b"upgrade", b"connection", b"http2-settings"} & set(named), named


@pytest.mark.parametrize("path", PATHS)
def test_a_cut_body_is_a_cut_stream_and_the_log_names_the_guest_port(
    guest: Guest, path: str, logged: Records, uvicorn_errors: Records
) -> None:
    """The relay's own line says which relay broke off; uvicorn's error line for an app
    that forgot to finish its response (it followed the relay's) is not logged for it."""
    client = guest.clients[path]
    with pytest.raises(httpx.RemoteProtocolError):
        client.get("/cut")
    relays = 1 if path != "through the agent" else 2  # the agent's, then the proxy's
    wait_until(
        lambda: len([m for m in logged.messages if "broke off" in m]) == relays,
        what="the relays to log the cut",
    )
    port = LOOPBACK_PORT if path == "through the agent" else EVERY_ADDRESS_PORT
    sandbox_id = guest.sandbox.sandbox_id
    for line in (m for m in logged.messages if "broke off" in m):
        # The SDK's spelling of the id, as the proxy's lines have it; no envd, no host pid.
        assert line.startswith(f"guest port {port} relay for {sandbox_id}"), line
        assert "envd" not in line, line
        assert not re.search(r"\d+:\d+|/proc/", line), line
    if path == "straight":
        assert any("(straight)" in m for m in logged.messages), logged.messages
    assert client.get("/plain").content == b"plain"
    assert uvicorn_errors.messages == []


def test_a_port_nothing_answers_on_is_named_with_its_sandbox(guest: Guest) -> None:
    """Once ``nothing answers on port 8080: cannot connect to 3024:8080 ...``, 3024 a host
    pid: now the sandbox and the port the caller asked for, on both routes."""
    sandbox_id = guest.sandbox.sandbox_id
    expected = {
        "error": f"nothing answers on port {NOTHING_PORT} of sandbox {sandbox_id}: "
        "cannot connect: Connection refused"
    }
    host = {"Host": guest.sandbox.get_host(NOTHING_PORT)}
    through_proxy = httpx.get(guest.proxy_url + "/", headers=host, timeout=30)
    assert (through_proxy.status_code, through_proxy.json()) == (502, expected)
    route = str(guest.clients["the agent's route"].base_url).rstrip("/")
    at_the_agent = guest.clients["the agent's route"].get(
        route.replace(f"/ports/{EVERY_ADDRESS_PORT}", f"/ports/{NOTHING_PORT}") + "/"
    )
    assert (at_the_agent.status_code, at_the_agent.json()) == (502, expected)

"""The relay to a guest port, as a tenant attacks it: a hostile server
(tests/proxy/hostile_server.py) in a real bubblewrap sandbox, reached through the envd
proxy and the agent's guest-port route (the stack's sandboxes have no network, so every
guest-port request goes through the agent, whose connections the proxy shares between
tenants), beside another tenant using the unmodified e2b SDK."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.proxy.sdk_stack import create_sandbox
from tests.sandboxd.servers import wait_until

PORT = 8000
SERVER = Path(__file__).with_name("hostile_server.py").read_text()
FORGED = b"forged"
ROUNDS = 10


class Records(logging.Handler):
    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self) -> list[str]:
        return [record.getMessage() for record in self.records]


@pytest.fixture
def hostile(sdk: dict[str, Any]) -> Iterator[tuple[Any, httpx.Client]]:
    """A sandbox running the hostile server, and a client of its guest port through the
    proxy (routed by Host, as ``get_host`` names it; no token: a public sandbox)."""
    sandbox = create_sandbox(sdk)
    try:
        sandbox.files.write("/home/user/hostile_server.py", SERVER)
        sandbox.commands.run(f"python3 /home/user/hostile_server.py {PORT}", background=True)
        host = {"Host": sandbox.get_host(PORT)}
        with httpx.Client(base_url=sdk["sandbox_url"], headers=host, timeout=30) as client:

            def answers() -> bool:
                return client.get("/plain").content == b"plain"

            wait_until(answers, what="the hostile server to answer")
            yield sandbox, client
    finally:
        sandbox.kill()


@pytest.fixture
def uvicorn_errors() -> Iterator[Records]:
    """What the agent's and the proxy's servers log at error and above meanwhile."""
    records = Records(logging.ERROR)
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(records)
    yield records
    logger.removeHandler(records)


def stats(sandbox: Any) -> dict[str, int]:
    """The hostile server's counts, read through envd (not its port)."""
    counts: dict[str, int] = json.loads(sandbox.files.read("/tmp/hostile-stats.json"))
    return counts


def test_a_forged_answer_never_reaches_another_tenant(
    sdk: dict[str, Any], hostile: tuple[Any, httpx.Client]
) -> None:
    _, client = hostile
    tenant_b = create_sandbox(sdk)
    try:
        secret = "tenant B's own file\n"
        tenant_b.files.write("/home/user/secret.txt", secret)
        read_by_b: list[str] = []
        answered_to_a: list[tuple[int, bytes]] = []
        next_for_a: list[bytes] = []
        for _ in range(ROUNDS):
            try:  # the attack: a response, then a 100 Continue and more
                desync = client.get("/desync")
                answered_to_a.append((desync.status_code, desync.content))
            except httpx.HTTPError as error:
                answered_to_a.append((0, repr(error).encode()))
            try:
                read_by_b.append(tenant_b.files.read("/home/user/secret.txt"))
            except Exception as error:  # the SDK's, whatever the relay made of its answer
                read_by_b.append(repr(error))
            next_for_a.append(client.get("/plain").content)  # no token: a guest port
        assert read_by_b == [secret] * ROUNDS
        assert next_for_a == [b"plain"] * ROUNDS
        # A gets exactly what its server sent as the answer: a 200 whose body is the
        # forged response's bytes, never that response on its own.
        forged = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 6\r\n\r\nforged"
        assert answered_to_a == [(200, forged)] * ROUNDS
    finally:
        tenant_b.kill()


def test_bytes_after_an_answer_or_on_an_idle_connection_answer_no_request(
    hostile: tuple[Any, httpx.Client],
) -> None:
    sandbox, client = hostile
    for _ in range(ROUNDS):
        assert client.get("/extra").content == b"plain"
        assert client.get("/plain").content == b"plain"  # not the forged bytes after it
    # A clean answer, after which the server writes a forged response on the
    # connection as it sits idle in the agent's pool. Nothing but envd is used until
    # the agent has closed it.
    assert client.get("/idle").content == b"plain"
    sandbox.commands.run("touch /tmp/hostile-poke")
    wait_until(lambda: stats(sandbox)["junk_sent"] == 1, what="the bytes on the idle connection")
    wait_until(lambda: stats(sandbox)["closed_after_junk"] == 1, what="the agent to close it")
    assert client.get("/plain").content == b"plain"


def test_odd_answers_are_relayed_as_the_rfcs_say_and_nothing_is_logged(
    hostile: tuple[Any, httpx.Client], uvicorn_errors: Records
) -> None:
    _, client = hostile
    switched = client.get("/101")
    assert switched.status_code == 502
    assert switched.json() == {
        "error": "port 8000 did not answer with one valid HTTP/1.1 response: "
        "the server switched protocols (101) unasked"
    }
    for path, status in (("/204", 204), ("/304", 304)):
        response = client.get(path)
        assert (response.status_code, response.content) == (status, b"")
        assert "content-length" not in response.headers
        assert "transfer-encoding" not in response.headers
    head = client.head("/head")
    assert (head.status_code, head.content) == (200, b"")
    assert head.headers["content-length"] == "1000"
    interim = client.get("/interim")
    assert (interim.status_code, interim.content) == (200, b"plain")
    assert "link" not in interim.headers
    busybox = client.get("/busybox")  # no length, Connection: close
    assert busybox.status_code == 404
    assert busybox.content.endswith(b"</BODY></HTML>\n")
    assert len(busybox.headers.get_list("date")) == 1
    assert busybox.headers.get_list("server") == ["uvicorn"]
    assert client.get("/plain").content == b"plain"
    assert uvicorn_errors.messages() == []


def test_a_body_ended_by_the_close_arrives_byte_exact(hostile: tuple[Any, httpx.Client]) -> None:
    _, client = hostile
    expected = hashlib.sha256(
        b"".join(hashlib.sha256(b"%d" % i).digest() for i in range((10 << 20) // 32))
    ).hexdigest()
    started = time.monotonic()
    response = client.get("/big")
    assert response.status_code == 200
    assert len(response.content) == 10 << 20
    assert hashlib.sha256(response.content).hexdigest() == expected
    assert time.monotonic() - started < 20


@pytest.mark.parametrize("path", ["/cut", "/cutchunked"])
def test_a_cut_body_is_a_cut_stream_and_the_logs_name_the_guest_port(
    hostile: tuple[Any, httpx.Client], path: str
) -> None:
    _, client = hostile
    records = Records(logging.INFO)
    logger = logging.getLogger("sandboxctl")
    logger.addHandler(records)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        with pytest.raises(httpx.RemoteProtocolError):
            client.get(path)
        wait_until(
            lambda: len([m for m in records.messages() if "broke off" in m]) == 2,
            what="both relays to log the cut",
        )
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    relayed = [m for m in records.messages() if "broke off" in m]
    # The agent's relay from the guest, then the proxy's from the agent.
    assert all(m.startswith(f"guest port {PORT} relay for ") for m in relayed), relayed
    assert not any("envd" in m for m in relayed), relayed
    assert not any(re.search(r"\d+:\d+|/proc/", m) for m in relayed), relayed
    assert client.get("/plain").content == b"plain"


def test_a_port_nothing_listens_on_is_a_502_that_names_no_host_pid(
    hostile: tuple[Any, httpx.Client],
) -> None:
    sandbox, client = hostile
    response = client.get("/", headers={"Host": sandbox.get_host(PORT + 1)})
    assert response.status_code == 502
    assert response.json() == {
        "error": f"nothing answers on port {PORT + 1} of sandbox {sandbox.sandbox_id}: "
        "cannot connect: Connection refused"
    }


def test_a_guest_gets_the_target_the_caller_sent_byte_for_byte(
    hostile: tuple[Any, httpx.Client], uvicorn_errors: Records
) -> None:
    """The agent's relay once rebuilt the request line from the decoded path: %20, %0D
    and %2F became a space, a bare CR and a slash on the guest's request line (a
    request-line injection), and a path that is not Latin-1 once decoded a 500."""
    _, client = hostile
    for target in ("/echo%20x%0D%0AHost:%20evil", "/echo/a%2Fb?q=%2F%20", "/echo%E2%80%A8"):
        answered = client.get(target)
        assert (answered.status_code, answered.content) == (200, target.encode())
    assert uvicorn_errors.records == []

"""Read bounds, for every service that listens: each listener, the HTTPS ones and the
``/metrics`` of the publisher and the guard included, closes a silent connection within
the head bound and holds at most its limit of connections, one listener's full house
leaving the others free (``serve``'s own traffic to its agent goes on)."""

from __future__ import annotations

import contextlib
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from sandboxctl.guard.serve import GuardHttp
from sandboxctl.publisher.metrics import PublishMetrics
from sandboxctl.serving.bounds import ReadBounds
from tests.apiserver.helpers import KUBE_TOKEN, kube_tls
from tests.fleet.fleet import free_ports, start_fleet, stop_fleets
from tests.sandboxd.servers import (
    agent_process,
    free_port,
    sandboxes_unavailable,
    service_process,
    write_token,
)
from tests.serving.attack import (
    BOUND_FLAGS,
    HEAD,
    LIMIT,
    SLACK,
    connect,
    read_until_closed,
    trickle,
)

NEEDS_AGENT = pytest.mark.skipif(
    sandboxes_unavailable() is not None, reason=str(sandboxes_unavailable())
)
BOUNDS = ReadBounds(head_timeout=HEAD, body_idle_timeout=HEAD, max_connections=LIMIT)


def assert_bounded(address: str) -> None:
    """A silent connection is answered 408 and closed within the head bound; of more
    connections than the limit, the last ones are closed at once, unanswered."""
    with connect(address) as silent:
        answer, after = read_until_closed(silent, HEAD + 2 * SLACK)
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), (address, answer)
    assert HEAD - 0.2 <= after <= HEAD + SLACK, (address, after)
    with contextlib.ExitStack() as opened:
        socks = [opened.enter_context(connect(address)) for _ in range(LIMIT + 2)]
        for sock in socks[-2:]:
            assert read_until_closed(sock, HEAD) == (b"", pytest.approx(0, abs=HEAD)), address


def assert_bounded_tls(address: str, certificate: Path) -> None:
    """On an HTTPS listener the bound counts from the accept: a connection that never
    starts its handshake is closed within it, and one that trickles its head after the
    handshake is answered 408 within it."""
    with connect(address) as silent:
        answer, after = read_until_closed(silent, HEAD + 2 * SLACK)
    assert (answer, after <= HEAD + SLACK) == (b"", True), (address, after)
    context = ssl.create_default_context(cafile=str(certificate))
    [client] = trickle(address, count=1, interval=0.2, timeout=HEAD + 2 * SLACK, tls=context)
    assert client.received.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert client.closed_after is not None
    assert client.closed_after <= HEAD + SLACK


@pytest.fixture
def agent(state_dir: Path, uid_base: int) -> Iterator[str]:
    """A development agent (no token) for the services that read a fleet."""
    address = f"127.0.0.1:{free_port()}"
    args = ["--listen", address, "--state-dir", str(state_dir / "sd"), "--uid-base", str(uid_base)]
    with agent_process([*args, *BOUND_FLAGS], address):
        yield address


@NEEDS_AGENT
def test_serve_sandboxd(agent: str) -> None:
    assert_bounded(agent)


@NEEDS_AGENT
def test_serve_apiserver_over_https_and_its_e2b_api(agent: str, tmp_path: Path) -> None:
    tls = kube_tls()
    kube, e2b = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    args = [
        "serve-apiserver", "--sandboxd-seeds", agent, "--inventory-poll", "1s",
        "--kube-token-file", str(write_token(tmp_path / "kube", f"{KUBE_TOKEN} *")),
        "--listen", kube, "--tls-cert-file", str(tls.cert_file),
        "--tls-private-key-file", str(tls.key_file), "--e2b-listen", e2b,
        "--e2b-api-key-file", str(write_token(tmp_path / "keys", "e2b_key default")),
        "--e2b-domain", "sandboxes.test",
        "--e2b-envd-secret-file", str(write_token(tmp_path / "secret", "s")), *BOUND_FLAGS,
    ]  # fmt: skip
    verify = ssl.create_default_context(cafile=str(tls.cert_file))
    with service_process(args, f"https://{kube}/healthz", verify=verify):
        assert_bounded_tls(kube, tls.cert_file)
        assert_bounded_tls(e2b, tls.cert_file)


@NEEDS_AGENT
def test_serve_proxy(agent: str, tmp_path: Path) -> None:
    proxy = f"127.0.0.1:{free_port()}"
    args = [
        "serve-proxy", "--domain", "sandboxes.test", "--sandboxd-seeds", agent,
        "--e2b-envd-secret-file", str(write_token(tmp_path / "secret", "s")),
        "--inventory-poll", "1s", "--listen", proxy, *BOUND_FLAGS,
    ]  # fmt: skip
    with service_process(args, f"http://{proxy}/healthz"):
        assert_bounded(proxy)


@NEEDS_AGENT
def test_serve_every_listener_and_room_for_its_own_traffic(state_dir: Path, uid_base: int) -> None:
    """``serve``'s four listeners, its HTTPS Sandbox API included; the e2b listener full
    (its limit of connections, then more) leaves the agent's listener free: the fleet's
    inventory polls and a client's request to the agent go on."""
    ports = free_ports()
    fleet = start_fleet(state_dir / "fleet", ports, uid_base, *BOUND_FLAGS, pool="default=0")
    try:
        for name in ("sandboxd", "e2b", "proxy"):
            assert_bounded(f"127.0.0.1:{ports[name]}")
        assert_bounded_tls(f"127.0.0.1:{ports['kube']}", fleet.state_dir / "kube-tls.crt")
        token = (fleet.state_dir / "sandboxd-token").read_text().strip()
        with contextlib.ExitStack() as opened:
            for _ in range(LIMIT + 2):
                opened.enter_context(connect(f"127.0.0.1:{ports['e2b']}"))
            info = httpx.get(
                f"{fleet.url('sandboxd')}/v1/info",
                headers={"Authorization": f"Bearer {token}"},
                timeout=5,
            )
            assert info.status_code == 200
    finally:
        stop_fleets([fleet])


def test_the_guard_and_the_publisher_metrics() -> None:
    guard = GuardHttp(CollectorRegistry(), lambda: {}, lambda: True)
    metrics = PublishMetrics()
    with contextlib.ExitStack() as serving:
        serving.callback(guard.close)
        serving.callback(metrics.close)
        for port in (guard.serve("127.0.0.1", 0, BOUNDS), metrics.serve("127.0.0.1", 0, BOUNDS)):
            assert_bounded(f"127.0.0.1:{port}")
            started = time.monotonic()
            assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 200
            assert time.monotonic() - started < HEAD

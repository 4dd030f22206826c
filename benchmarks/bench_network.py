"""Every sandbox's network: claim with a policy, starts with and without it, NAT
throughput, guest ports through the proxy.

One in-process :class:`Agent` with a :class:`SandboxNetwork` (an auto subnet, no DNS)
served on loopback with a root token, a second one without a network for the side-by-side
start figures, a test host in a network namespace (198.51.100.0/24, see
``sandboxctl/testing/nethost.py``) and, for guest ports, the envd proxy over a store of
that agent. Needs root, bubblewrap, iproute2 and nftables; otherwise one ``skipped`` row.

- ``warm claim with policy (http)``: ``POST /v1/claim`` with ``network`` (internet, 8
  allow and 8 deny CIDRs), in batches of 10 with a refill between: the policy is one
  nftables transaction on the claim path. Target p50 <= 5 ms.
- ``cold start``: ``agent.claim`` of a key without a warm pool, with the network and
  without, interleaved (each released, untimed); ``network cost`` is the p50 difference.
- ``starts per second (network)``: a refill of 20 from empty.
- ``TCP throughput``: 256 MiB sent to a sink on the test host, from a sandbox through NAT
  and from the host itself; ``ratio`` = sandbox / host, target >= 0.8.
- ``get_host request``: a GET to a server in the sandbox, through the proxy
  (``8000-ID.domain``, kept-alive client) and straight to the sandbox's loopback (a
  connection made inside its namespace, kept alive); ``added`` is the p50 difference,
  target <= 1 ms.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path

import httpx

from benchmarks import Row, with_target
from benchmarks.bench_envd import _free_port, _serving
from benchmarks.timing import Timing, measure
from sandboxctl.agentapi import AgentClient, ClaimRequest
from sandboxctl.core.model import PoolKey
from sandboxctl.core.netpolicy import policy
from sandboxctl.sandboxd.agent import Agent, AgentSettings
from sandboxctl.sandboxd.api import create_app
from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime, sandbox_env
from sandboxctl.sandboxd.guestports import connect_inside
from sandboxctl.sandboxd.network.sandboxes import SandboxNetwork
from sandboxctl.testing.nethost import NetHost, net_host

NAME = "network"
WARM = PoolKey("base")
COLD = PoolKey("base", "none", "medium")
UID_BASE = 3_500_000 + (os.getpid() % 10_000) * 100
TOKEN = "bench-network-token"
SECRET = b"bench-network-secret"
DOMAIN = "sandboxes.bench"
SINK_PORT = 9000
THROUGHPUT_BYTES = 256 << 20
POLICY = policy(
    True,
    allow_out=[f"198.51.100.{n}/32" for n in range(8)],
    deny_out=[f"203.0.113.{8 * n}/29" for n in range(8)],
)
GUEST = """
import http.server
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    wbufsize = 1 << 16  # head and body in one write: no Nagle wait between them
    disable_nagle_algorithm = True
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), H).serve_forever()
"""
SEND = """
import socket, sys, time
total = int(sys.argv[3])
chunk = b"x" * (1 << 20)
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), 5)
started = time.perf_counter()
for _ in range(total // len(chunk)):
    s.sendall(chunk)
s.shutdown(socket.SHUT_WR)
assert int(s.recv(100)) == total
print(time.perf_counter() - started)
"""


def run() -> Iterator[Row]:
    reason = _unavailable()
    if reason:
        yield {"benchmark": NAME, "case": "skipped", "reason": reason}
        return
    with ExitStack() as stack:
        folder = Path(tempfile.mkdtemp(prefix="sandboxctl-bench-net-", dir="/tmp"))
        folder.chmod(0o711)
        stack.callback(shutil.rmtree, folder, ignore_errors=True)
        networked = _agent(stack, folder / "net", UID_BASE, SandboxNetwork(
            secrets.token_hex(8), "auto", None, folder
        ))  # fmt: skip
        plain = _agent(stack, folder / "plain", UID_BASE + 50, None)
        address = networked.settings.advertise_addr
        port = int(address.rpartition(":")[2])
        stack.enter_context(_serving(create_app(networked, TOKEN), port))
        client = AgentClient(f"http://{address}", TOKEN)
        stack.callback(client.close)
        yield _warm_claims(networked, client)
        yield from _cold_starts(networked, plain)
        yield _starts_per_second(networked)
        host = stack.enter_context(net_host(extra_addresses=1))
        yield _throughput(networked, host)
        yield from _guest_port(stack, networked, address)


def _agent(stack: ExitStack, state: Path, uid_base: int, network: SandboxNetwork | None) -> Agent:
    state.mkdir(mode=0o711)
    settings = AgentSettings(
        node="bench-net", advertise_addr=f"127.0.0.1:{_free_port()}", state_dir=state,
        pools={}, max_sandboxes=40, uid_base=uid_base,
    )  # fmt: skip
    agent = Agent(settings, BubblewrapRuntime(), network=network)
    agent.adopt()
    stack.callback(agent.stop, destroy=True)
    return agent


def _warm_claims(agent: Agent, client: AgentClient) -> Row:
    samples: list[float] = []
    request = ClaimRequest("base", network=POLICY, ttl_seconds=600)
    for _ in range(5):
        agent.set_pools({WARM: 10})
        agent.refill_once()
        for _ in range(10):
            started = time.perf_counter_ns()
            grant = client.claim(request)
            samples.append(time.perf_counter_ns() - started)
            assert agent.get(grant.id).network == POLICY
        for record in agent.sandboxes():
            agent.release(record.id)
    agent.set_pools({})
    timing = Timing(tuple(sorted(samples)))
    row = _row("warm claim with policy (http)", **timing.figures("ms"))
    return with_target(row, timing.p50_ns / 1e6 <= 5.0, "p50 <= 5 ms")


def _cold_starts(networked: Agent, plain: Agent) -> Iterator[Row]:
    times: dict[str, list[float]] = {"with network": [], "without network": []}
    for _ in range(15):
        for label, agent in (("with network", networked), ("without network", plain)):
            started = time.perf_counter_ns()
            record = agent.claim(ClaimRequest(COLD.template, size=COLD.size))
            times[label].append(time.perf_counter_ns() - started)
            agent.release(record.id)
    p50 = {}
    for label, samples in times.items():
        timing = Timing(tuple(sorted(samples)))
        p50[label] = timing.p50_ns / 1e6
        yield _row(f"cold start ({label})", **timing.figures("ms"))
    yield _row(
        "cold start: network cost", p50_ms=round(p50["with network"] - p50["without network"], 2)
    )


def _starts_per_second(agent: Agent) -> Row:
    agent.set_pools({WARM: 20})
    started = time.perf_counter()
    count = agent.refill_once()
    elapsed = time.perf_counter() - started
    agent.set_pools({})
    return _row("starts per second (network)", ops_per_s=round(count / elapsed, 1), runs=count)


def _throughput(agent: Agent, host: NetHost) -> Row:
    target = host.addresses[0]
    host.serve_tcp(target, SINK_PORT, mode="sink")
    record = agent.claim(ClaimRequest("base", network=policy(True)))
    argv = ["python3", "-c", SEND, target, str(SINK_PORT), str(THROUGHPUT_BYTES)]
    inside = agent.runtime.enter_command(agent.spec(record), agent.identity(record), argv)
    rates: dict[str, list[float]] = {"sandbox": [], "host": []}
    for _ in range(3):
        for label, command in (("sandbox", inside), ("host", argv)):
            done = subprocess.run(
                command, env=sandbox_env(), capture_output=True, text=True, check=True
            )
            rates[label].append(THROUGHPUT_BYTES / float(done.stdout) / (1 << 20))
    agent.release(record.id)
    sandbox, direct = max(rates["sandbox"]), max(rates["host"])
    ratio = sandbox / direct
    row = _row(
        "TCP throughput sandbox->test host (NAT) / host->test host",
        sandbox_mib_s=round(sandbox), host_mib_s=round(direct), ratio=round(ratio, 2),
    )  # fmt: skip
    return with_target(row, ratio >= 0.8, "ratio >= 0.8")


def _guest_port(stack: ExitStack, agent: Agent, address: str) -> Iterator[Row]:
    from sandboxctl.apiserver.e2b.ids import public_id
    from sandboxctl.core.freshness import FreshnessRule
    from sandboxctl.inventory.mesh import MeshInventorySource
    from sandboxctl.proxy import create_proxy_app
    from sandboxctl.store import SandboxStore
    from sandboxctl.store.nodes import NodeAccess

    record = agent.claim(ClaimRequest("base", ttl_seconds=600))
    server = agent.runtime.enter_command(
        agent.spec(record), agent.identity(record), ["python3", "-c", GUEST]
    )
    guest = subprocess.Popen(server, env=sandbox_env(), start_new_session=True)
    stack.callback(guest.wait)
    stack.callback(guest.kill)
    source = MeshInventorySource([address], TOKEN, poll_interval=timedelta(seconds=0.2))
    source.start()
    stack.callback(source.stop)
    store = SandboxStore(source, FreshnessRule(), nodes=NodeAccess(TOKEN))
    stack.callback(store.close)
    proxy_url = stack.enter_context(_serving(create_proxy_app(store, SECRET, DOMAIN)))
    host = f"8000-{public_id(record.id)}.{DOMAIN}"
    client = stack.enter_context(httpx.Client(base_url=proxy_url, headers={"Host": host}))
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if client.get("/").status_code == 200:
                break
        if time.monotonic() > deadline:
            raise RuntimeError("the guest server never answered through the proxy")
        time.sleep(0.1)
    sock = connect_inside(agent.identity(record).pid, 8000)
    stack.callback(sock.close)
    request = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"

    def direct() -> None:
        sock.sendall(request)
        answer = b""
        while not answer.endswith(b"ok"):
            answer += sock.recv(4096)

    def proxied() -> None:
        client.get("/")

    loop = measure(direct, runs=300, warmup=20)
    relayed = measure(proxied, runs=300, warmup=20)
    yield _row("get_host: sandbox loopback (direct)", **loop.figures("ms"))
    yield _row("get_host: through the proxy", **relayed.figures("ms"))
    added = (relayed.p50_ns - loop.p50_ns) / 1e6
    yield with_target(
        _row("get_host: added by proxy and agent", p50_ms=round(added, 2)),
        added <= 1.0,
        "p50 <= 1 ms",
    )


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("bwrap", "ip", "nft", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    with contextlib.suppress(OSError), socket.socket():
        return None
    return "no sockets"


def _row(case: str, **figures: object) -> Row:
    return {"benchmark": NAME, "case": case, **figures}

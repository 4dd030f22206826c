"""A 10 MiB answer whose body ends when the server closes the connection (no length, no
chunks, ``Connection: close``), through a guest port, on each path it can take.

One in-process :class:`Agent` with a :class:`SandboxNetwork` served on loopback, and the
envd proxy over a store of that agent. A sandbox runs a server (the standard library
only) that answers every request with the same 10 MiB, ended by the close: on every
address at port 8000 (the proxy reaches it straight, through the sandbox's veth) and on
the sandbox's loopback at port 8001 (the proxy goes through the agent, which connects
inside the sandbox). The agent's own guest-port route is asked too, without the proxy.
Each fetch is timed from the request to the last byte and its body compared with what
the server sent, byte for byte.

Target: byte-exact on every fetch (issue 22). Needs root, bubblewrap, iproute2 and
nftables; otherwise one ``skipped`` row. Nothing leaves the host.
"""

from __future__ import annotations

import hashlib
import http.client
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

from benchmarks import Row, with_target
from benchmarks.bench_envd import _wait
from benchmarks.bench_network import _unavailable, proxy_over, served_agent
from benchmarks.timing import Timing
from sandboxctl.agentapi import ClaimRequest
from sandboxctl.core.model import PoolKey
from sandboxctl.envd.host import Command
from sandboxctl.sandboxd import entering

NAME = "guest_framing"
WARM = PoolKey("base")
UID_BASE = 3_700_000 + (time.monotonic_ns() // 1000 % 10_000) * 100
TOKEN = "bench-guest-framing-token"
SECRET = b"bench-guest-framing-secret"
DOMAIN = "sandboxes.bench"
STRAIGHT_PORT, LOOPBACK_PORT = 8000, 8001
RUNS = 8
SIZE = 10 << 20
# What the server sends: the same bytes the benchmark builds to compare with.
SERVER = """
import hashlib, socket, sys, threading
BIG = b"".join(hashlib.sha256(b"%d" % i).digest() for i in range((10 << 20) // 32))
def serve(conn, peer):
    with conn:
        data = b""
        while b"\\r\\n\\r\\n" not in data:
            more = conn.recv(65536)
            if not more:
                return
            data += more
        head = b"HTTP/1.1 200 OK\\r\\nx-peer: %b\\r\\nconnection: close\\r\\n\\r\\n" % peer.encode()
        conn.sendall(head + BIG)
        conn.shutdown(socket.SHUT_WR)
def listen(address, port):
    server = socket.create_server((address, port))
    while True:
        conn, (peer, _) = server.accept()
        threading.Thread(target=serve, args=(conn, peer), daemon=True).start()
threading.Thread(target=listen, args=("0.0.0.0", int(sys.argv[1])), daemon=True).start()
listen("127.0.0.1", int(sys.argv[2]))
"""
BIG_SHA256 = hashlib.sha256(
    b"".join(hashlib.sha256(b"%d" % i).digest() for i in range(SIZE // 32))
).digest()


def run() -> Iterator[Row]:
    reason = _unavailable()
    if reason:
        yield {"benchmark": NAME, "case": "skipped", "reason": reason}
        return
    from sandboxctl.core.ids import SandboxId

    with ExitStack() as stack:
        folder = Path(tempfile.mkdtemp(prefix="sandboxctl-bench-framing-", dir="/tmp"))
        folder.chmod(0o711)
        stack.callback(shutil.rmtree, folder, ignore_errors=True)
        agent = served_agent(stack, folder, UID_BASE, TOKEN)
        store, proxy_port = proxy_over(stack, agent.settings.advertise_addr, TOKEN, SECRET, DOMAIN)
        proxy = ("127.0.0.1", proxy_port)

        agent.set_pools({WARM: 1})
        agent.refill_once()
        record = agent.claim(ClaimRequest("base", ttl_seconds=600))
        agent.set_pools({})
        stack.callback(agent.release, record.id)
        sandbox_id = SandboxId.of_claim(record.id)
        _wait(lambda: store.owner(sandbox_id) is not None, 30, "the store to know the sandbox")
        command = ["python3", "-c", SERVER, str(STRAIGHT_PORT), str(LOOPBACK_PORT)]
        entry = agent.runtime.enter(agent.spec(record), agent.identity(record), Command(command))
        process = entering.popen(entry)
        stack.callback(process.wait)
        stack.callback(process.kill)

        agent_host, _, agent_port = agent.settings.advertise_addr.rpartition(":")
        paths = {
            "straight from the proxy": (
                proxy,
                "/",
                {"Host": f"{STRAIGHT_PORT}-{sandbox_id.public}.{DOMAIN}"},
            ),
            "proxy, then the agent": (
                proxy,
                "/",
                {"Host": f"{LOOPBACK_PORT}-{sandbox_id.public}.{DOMAIN}"},
            ),
            "the agent's route alone": (
                (agent_host, int(agent_port)),
                f"/v1/sandboxes/{record.id}/ports/{STRAIGHT_PORT}/",
                {"Authorization": f"Bearer {TOKEN}"},
            ),
        }
        # Straight, the server sees the gateway; a refusal before it listened sends the
        # proxy through the agent for a while, so wait until it is reached straight.
        straight = paths["straight from the proxy"]
        _wait(lambda: _peer(*straight) not in ("", "127.0.0.1"), 30, "the guest reached straight")
        for case, (where, target, headers) in paths.items():
            yield _measure(case, where, target, headers)


def _measure(case: str, where: tuple[str, int], target: str, headers: dict[str, str]) -> Row:
    samples, exact = [], 0
    for _ in range(RUNS):
        started = time.perf_counter_ns()
        status, body, _ = _fetch(where, target, headers)
        samples.append(time.perf_counter_ns() - started)
        exact += status == 200 and len(body) == SIZE and hashlib.sha256(body).digest() == BIG_SHA256
    timing = Timing(tuple(sorted(samples)))
    row: Row = {
        "benchmark": NAME,
        "case": f"10 MiB ended by the close, {case}",
        **timing.figures("ms", p99=False),
        "mib_per_second": round(SIZE / (1 << 20) / (timing.p50_ns / 1e9), 1),
        "byte_exact": f"{exact}/{RUNS}",
    }
    return with_target(row, exact == RUNS, "byte-exact")


def _peer(where: tuple[str, int], target: str, headers: dict[str, str]) -> str:
    try:
        status, _, peer = _fetch(where, target, headers)
    except OSError:
        return ""
    return peer if status == 200 else ""


def _fetch(where: tuple[str, int], target: str, headers: dict[str, str]) -> tuple[int, bytes, str]:
    """One GET on a new connection: status, the whole body, and who the guest saw."""
    connection = http.client.HTTPConnection(*where, timeout=30)
    try:
        connection.request("GET", target, headers=headers)
        response = connection.getresponse()
        return response.status, response.read(), response.getheader("x-peer") or ""
    finally:
        connection.close()

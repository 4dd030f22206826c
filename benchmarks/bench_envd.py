"""The envd proxy on a real stack: added latency, throughput, and memory under an upload.

One real host agent (bubblewrap, warm pool), the mesh inventory, a store with node
access, the e2b API and the envd proxy, all in-process on loopback (as tests/proxy do).

1. ``commands.run("true")``: the unmodified e2b SDK through the proxy (p50/p99), then
   the same Connect ``process.Process/Start`` request sent with httpx (keep-alive) through
   the proxy (``E2b-Sandbox-Id`` + ``X-Access-Token``) and straight to the agent's
   ``/v1/sandboxes/{id}/envd/process.Process/Start`` (Bearer claim token), interleaved in
   one run (alternating which goes first). Target: added p50 (proxy - direct) <= 1 ms.
2. Throughput: a unary ``process.Process/List`` hammered ``HAMMER`` times by ``CLIENTS``
   concurrent keep-alive clients, through the proxy and direct, side by side; once with
   the proxy in this process (it shares the GIL with the clients and the agent) and once
   with the proxy as its own process (``sandboxctl serve-proxy``, as deployed). Target:
   proxy >= 60 % of direct.
3. RSS of the ``sandboxctl serve-proxy`` process while 200 MiB is uploaded through it
   (``POST /files?path=``, octet-stream, streamed from a generator); VmRSS sampled every
   5 ms on a thread. Target: growth < 50 MB.

Skipped (one row) without root and bubblewrap.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from benchmarks import Row
from benchmarks.timing import Timing

KEY = "e2b_" + "e" * 40
TOKEN = "bench-envd-root-token"
SECRET = b"bench-envd-secret"
DOMAIN = "bench.test"
WARM = 2
UID_BASE = 8_000_000 + (os.getpid() % 10_000) * 32  # clear of the other benchmarks and tests
RUNS = 150
HAMMER = 2000
CLIENTS = 4
UPLOAD_MIB = 200
STREAM = "application/connect+json"


def run() -> Iterator[Row]:
    reason = _unavailable()
    if reason is not None:
        yield _row("envd proxy", skipped=reason)
        return
    with ExitStack() as stack:
        stack_ = _Stack.start(stack)
        yield from _round_trips(stack_)
        yield from _throughput(stack_, stack_.proxy_url, "in-process proxy")
        proxy_process, proxy_url = stack.enter_context(_proxy_process(stack_))
        yield from _throughput(stack_, proxy_url, "serve-proxy process")
        yield from _upload_rss(stack_, proxy_process, proxy_url)


def _row(case: str, **figures: Any) -> Row:
    return {"benchmark": "envd", "case": case, **figures}


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "real sandboxes need root"
    missing = [t for t in ("bwrap", "setpriv", "nsenter") if shutil.which(t) is None]
    return f"missing {', '.join(missing)}" if missing else None


# --- the stack --------------------------------------------------------------------------


class _Stack:
    def __init__(self) -> None:
        self.agent: Any = None
        self.agent_address = ""
        self.proxy_url = ""
        self.sdk: dict[str, Any] = {}
        self.sandbox: Any = None
        self.claim_id = ""
        self.claim_token = ""

    @classmethod
    def start(cls, stack: ExitStack) -> _Stack:
        from e2b import Sandbox

        from sandboxctl.apiserver.e2b import E2bConfig, create_e2b_app
        from sandboxctl.apiserver.e2b.ids import public_id
        from sandboxctl.core.freshness import FreshnessRule
        from sandboxctl.core.model import PoolKey
        from sandboxctl.inventory.mesh import MeshInventorySource
        from sandboxctl.proxy import create_proxy_app
        from sandboxctl.sandboxd.agent import Agent, AgentSettings
        from sandboxctl.sandboxd.api import create_app
        from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime
        from sandboxctl.store import SandboxStore
        from sandboxctl.store.nodes import NodeAccess

        self = cls()
        state = Path(tempfile.mkdtemp(prefix="sandboxctl-bench-envd-", dir="/tmp"))
        state.chmod(0o711)
        stack.callback(shutil.rmtree, state, ignore_errors=True)
        port = _free_port()
        settings = AgentSettings(
            node="bench-envd",
            advertise_addr=f"127.0.0.1:{port}",
            state_dir=state,
            pools={PoolKey("base"): WARM},
            uid_base=UID_BASE,
            max_sandboxes=WARM + 4,
        )
        self.agent = Agent(settings, BubblewrapRuntime())
        stack.callback(self.agent.stop, destroy=True)
        self.agent.start()
        stack.enter_context(_serving(create_app(self.agent, TOKEN), port))
        self.agent_address = settings.advertise_addr
        source = MeshInventorySource(
            [self.agent_address], TOKEN, poll_interval=timedelta(seconds=0.2)
        )
        source.start()
        stack.callback(source.stop)
        nodes = NodeAccess(TOKEN)
        store = SandboxStore(source, FreshnessRule(), nodes=nodes)
        stack.callback(store.close)
        _wait(lambda: store.view().fresh_nodes() == ["bench-envd"], 30, "the node to list")
        _wait(
            lambda: sum(c.warm for c in store.view().warm_candidates(PoolKey("base"))) >= 1,
            60,
            "a warm sandbox",
        )
        config = E2bConfig(domain=DOMAIN, envd_secret=SECRET, api_keys={KEY: "default"})
        api_url = stack.enter_context(_serving(create_e2b_app(store, config)))
        proxy = create_proxy_app(store, SECRET, DOMAIN)
        self.proxy_url = stack.enter_context(_serving(proxy))
        self.sdk = {"api_key": KEY, "api_url": api_url, "sandbox_url": self.proxy_url}
        self.sandbox = Sandbox.create(**self.sdk)
        stack.callback(self.sandbox.kill)
        self.claim_id = next(
            r.id for r in self.agent.sandboxes() if public_id(r.id) == self.sandbox.sandbox_id
        )
        self.claim_token = self.agent.token_of(self.claim_id)
        return self

    def proxy_headers(self) -> dict[str, str]:
        from sandboxctl.apiserver.e2b.models import envd_access_token

        return {
            "E2b-Sandbox-Id": self.sandbox.sandbox_id,
            "E2b-Sandbox-Port": "49983",
            "X-Access-Token": envd_access_token(SECRET, self.claim_token),
        }

    def direct_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.claim_token}"}

    @property
    def direct_base(self) -> str:
        return f"http://{self.agent_address}/v1/sandboxes/{self.claim_id}/envd"


# --- 1. commands.run("true") round trips -----------------------------------------------


def _start_body(cmd: str) -> bytes:
    message = {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", cmd]}, "stdin": False}
    data = json.dumps(message).encode()
    return struct.pack(">BI", 0, len(data)) + data


def _round_trips(stack: _Stack) -> Iterator[Row]:
    sandbox = stack.sandbox
    for _ in range(3):
        sandbox.commands.run("true")
    samples = []
    for _ in range(RUNS):
        begin = time.perf_counter_ns()
        sandbox.commands.run("true")
        samples.append(time.perf_counter_ns() - begin)
    sdk = Timing(tuple(sorted(samples)))
    yield _row('SDK commands.run("true") via proxy', **sdk.figures("ms"))

    body = _start_body("true")
    rpc = {"Content-Type": STREAM, "Connect-Protocol-Version": "1"}
    with (
        httpx.Client(base_url=stack.proxy_url, headers={**rpc, **stack.proxy_headers()}) as px,
        httpx.Client(base_url=stack.direct_base, headers={**rpc, **stack.direct_headers()}) as dx,
    ):

        def start(client: httpx.Client) -> int:
            begin = time.perf_counter_ns()
            reply = client.post("/process.Process/Start", content=body)
            took = time.perf_counter_ns() - begin
            if reply.status_code != 200 or b'"end"' not in reply.content:
                raise RuntimeError(f"Start failed: {reply.status_code} {reply.text[:200]}")
            return took

        for _ in range(3):
            start(px), start(dx)
        via, direct = [], []
        for i in range(RUNS):
            if i % 2:
                via.append(start(px))
                direct.append(start(dx))
            else:
                direct.append(start(dx))
                via.append(start(px))
    t_via, t_direct = Timing(tuple(sorted(via))), Timing(tuple(sorted(direct)))
    yield _row("Process/Start true, httpx via proxy", **t_via.figures("ms"))
    yield _row("Process/Start true, httpx direct to agent", **t_direct.figures("ms"))
    added = (t_via.p50_ns - t_direct.p50_ns) / 1e6
    yield _row(
        "Process/Start true, added p50 (proxy - direct)",
        added_p50_ms=round(added, 3),
        added_p99_ms=round((t_via.percentile(99) - t_direct.percentile(99)) / 1e6, 3),
        target="added p50 <= 1 ms",
        met=added <= 1,
    )


# --- 2. throughput ------------------------------------------------------------------------


def _hammer(base: str, headers: dict[str, str]) -> tuple[float, Timing]:
    """``HAMMER`` unary List calls by ``CLIENTS`` keep-alive clients: (ops/s, latency)."""
    headers = {**headers, "Content-Type": "application/json", "Connect-Protocol-Version": "1"}
    per_client = HAMMER // CLIENTS
    clients = [httpx.Client(base_url=base, headers=headers) for _ in range(CLIENTS)]
    barrier = threading.Barrier(CLIENTS + 1)

    def work(client: httpx.Client) -> list[int]:
        for _ in range(5):
            client.post("/process.Process/List", content=b"{}").raise_for_status()
        barrier.wait()
        out = []
        for _ in range(per_client):
            begin = time.perf_counter_ns()
            reply = client.post("/process.Process/List", content=b"{}")
            out.append(time.perf_counter_ns() - begin)
            if reply.status_code != 200:
                raise RuntimeError(f"List failed: {reply.status_code} {reply.text[:200]}")
        return out

    try:
        with ThreadPoolExecutor(CLIENTS) as pool:
            futures = [pool.submit(work, c) for c in clients]
            barrier.wait()
            begin = time.perf_counter_ns()
            samples = [s for f in futures for s in f.result()]
            took = (time.perf_counter_ns() - begin) / 1e9
    finally:
        for client in clients:
            client.close()
    return len(samples) / took, Timing(tuple(sorted(samples)))


def _throughput(stack: _Stack, proxy_url: str, label: str) -> Iterator[Row]:
    # Direct first and last, proxy in between: a drifting machine shows as a gap.
    direct_ops, direct_t = _hammer(stack.direct_base, stack.direct_headers())
    proxy_ops, proxy_t = _hammer(proxy_url, stack.proxy_headers())
    direct_ops2, direct_t2 = _hammer(stack.direct_base, stack.direct_headers())
    if direct_ops2 > direct_ops:
        direct_ops, direct_t = direct_ops2, direct_t2
    what = f"Process/List x{HAMMER}, {CLIENTS} clients"
    yield _row(
        f"{what}, direct to agent",
        ops_per_s=round(direct_ops),
        **direct_t.figures("ms", minimum=False),
    )
    yield _row(
        f"{what}, via {label}", ops_per_s=round(proxy_ops), **proxy_t.figures("ms", minimum=False)
    )
    ratio = proxy_ops / direct_ops
    yield _row(
        f"{what}, {label}/direct",
        ratio=round(ratio, 3),
        added_p50_ms=round((proxy_t.p50_ns - direct_t.p50_ns) / 1e6, 3),
        target="throughput >= 60 % of direct",
        met=ratio >= 0.6,
    )


# --- 3. RSS during a 200 MiB upload ------------------------------------------------------


@contextmanager
def _proxy_process(stack: _Stack) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``sandboxctl serve-proxy`` over the same agent, as its own process."""
    folder = Path(tempfile.mkdtemp(prefix="sandboxctl-bench-envd-proxy-", dir="/tmp"))
    try:
        secret_file, token_file = folder / "secret", folder / "token"
        secret_file.write_bytes(SECRET)
        token_file.write_text(TOKEN)
        for path in (secret_file, token_file):
            path.chmod(0o600)
        port = _free_port()
        command = [
            sys.executable, "-m", "sandboxctl", "serve-proxy",
            "--domain", DOMAIN,
            "--e2b-envd-secret-file", str(secret_file),
            "--sandboxd-seeds", stack.agent_address,
            "--sandboxd-token-file", str(token_file),
            "--inventory-poll", "200ms",
            "--listen", f"127.0.0.1:{port}",
        ]  # fmt: skip
        log = open(folder / "log", "wb")  # noqa: SIM115  (closed below)
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:

            def resolves() -> bool:
                if process.poll() is not None:
                    raise RuntimeError(
                        f"serve-proxy exited: {(folder / 'log').read_text()[-2000:]}"
                    )
                try:
                    reply = httpx.post(
                        f"{url}/process.Process/List",
                        content=b"{}",
                        headers={**stack.proxy_headers(), "Content-Type": "application/json"},
                        timeout=2,
                    )
                except httpx.HTTPError:
                    return False
                return reply.status_code == 200

            _wait(resolves, 30, "serve-proxy to route the sandbox")
            yield process, url
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def _upload_rss(stack: _Stack, process: subprocess.Popen[bytes], url: str) -> Iterator[Row]:
    chunk = os.urandom(1 << 20)
    headers = {**stack.proxy_headers(), "Content-Type": "application/octet-stream"}
    target = "/dev/null"  # the sandbox disk is small; the relay is what is measured

    def body() -> Iterator[bytes]:
        for _ in range(UPLOAD_MIB):
            yield chunk

    with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
        # Warm the relay path (a small upload) before the baseline.
        client.post("/files", params={"path": target}, content=body_of(chunk)).raise_for_status()
        baseline = _rss_kb(process.pid)
        peak = baseline
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, _rss_kb(process.pid))
                stop.wait(0.005)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        begin = time.perf_counter()
        try:
            reply = client.post("/files", params={"path": target}, content=body())
        finally:
            stop.set()
            sampler.join()
        took = time.perf_counter() - begin
        if reply.status_code != 200:
            raise RuntimeError(f"upload failed: {reply.status_code} {reply.text[:200]}")
        written = reply.json()
    growth = (peak - baseline) / 1024
    yield _row(
        f"serve-proxy RSS during a {UPLOAD_MIB} MiB upload (POST /files, streamed)",
        rss_before_mb=round(baseline / 1024, 1),
        rss_peak_mb=round(peak / 1024, 1),
        rss_growth_mb=round(growth, 1),
        upload_mib_per_s=round(UPLOAD_MIB / took, 1),
        files=len(written),
        target="growth < 50 MB",
        met=growth < 50,
    )


def body_of(data: bytes) -> Iterator[bytes]:
    yield data


# --- helpers ------------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def _serving(app: Any, port: int = 0) -> Iterator[str]:
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    _wait(lambda: server.started or not thread.is_alive(), 10, "a server to listen")
    if not server.started:
        raise RuntimeError("a server did not start")
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _wait(check: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.01)


if __name__ == "__main__":  # pragma: no cover
    for row in run():
        print(row, file=sys.stderr)

"""The envd proxy on a real stack: added latency, throughput, and memory under an upload.

A real host agent (``sandboxctl serve-sandboxd``: bubblewrap, a warm pool) and the envd
proxy (``sandboxctl serve-proxy``) run as their own processes on loopback, as deployed,
so the clients here share a GIL with neither. The e2b API (for ``Sandbox.create`` only)
runs in this process over the mesh inventory.

1. ``commands.run("true")``: the unmodified e2b SDK through the proxy (p50/p99), then
   the same Connect ``process.Process/Start`` request sent with httpx (keep-alive) through
   the proxy (``E2b-Sandbox-Id`` + ``X-Access-Token``) and straight to the agent's
   ``/v1/sandboxes/{id}/envd/process.Process/Start`` (Bearer claim token), interleaved in
   one run (alternating which goes first). Target: added p50 (proxy - direct) <= 1 ms.
2. Throughput: a unary ``process.Process/List`` hammered ``HAMMER`` times by ``CLIENTS``
   concurrent keep-alive clients, through the proxy and direct, side by side (direct
   before and after; the better direct run counts). Target: proxy >= 60 % of direct.
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
from sandboxctl.core.errors import SandboxctlError
from sandboxctl.lanes.processes import free_port

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
POLL = timedelta(seconds=1)


def run() -> Iterator[Row]:
    reason = _unavailable()
    if reason is not None:
        yield _row("envd proxy", skipped=reason)
        return
    with ExitStack() as stack:
        stack_ = _Stack.start(stack)
        proxy_process, proxy_url = stack.enter_context(_proxy_process(stack_))
        yield from _round_trips(stack_, proxy_url)
        yield from _throughput(stack_, proxy_url)
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
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.agent_address = ""
        self.sdk: dict[str, Any] = {}
        self.sandbox: Any = None
        self.claim_id = ""
        self.claim_token = ""

    @classmethod
    def start(cls, stack: ExitStack) -> _Stack:
        from e2b import Sandbox

        from sandboxctl.agentapi import AgentClient
        from sandboxctl.apiserver.e2b import E2bConfig, create_e2b_app
        from sandboxctl.core.freshness import FreshnessRule
        from sandboxctl.core.ids import SandboxId
        from sandboxctl.core.model import PoolKey
        from sandboxctl.inventory.mesh import MeshInventorySource
        from sandboxctl.proxy import create_proxy_app
        from sandboxctl.store import SandboxStore
        from sandboxctl.store.nodes import NodeAccess

        folder = Path(tempfile.mkdtemp(prefix="sandboxctl-bench-envd-", dir="/tmp"))
        folder.chmod(0o711)  # sandbox uids traverse it to their homes
        stack.callback(shutil.rmtree, folder, ignore_errors=True)
        self = cls(folder)
        for name, content in (("secret", SECRET), ("token", TOKEN.encode())):
            (folder / name).write_bytes(content)
            (folder / name).chmod(0o600)
        self.agent_address = f"127.0.0.1:{free_port()}"
        agent = AgentClient(f"http://{self.agent_address}", TOKEN)
        stack.callback(agent.close)
        command = [
            "serve-sandboxd",
            "--node", "bench-envd",
            "--listen", self.agent_address,
            "--state-dir", str(folder / "state"),
            "--token-file", str(folder / "token"),
            "--pool", f"base={WARM}",
            "--max-sandboxes", str(WARM + 4),
            "--uid-base", str(UID_BASE),
            "--destroy-on-exit",
        ]  # fmt: skip
        stack.enter_context(_service(folder, "sandboxd", command, lambda: _answers(agent.info)))
        source = MeshInventorySource([self.agent_address], TOKEN, poll_interval=POLL)
        source.start()
        stack.callback(source.stop)
        store = SandboxStore(source, FreshnessRule(), nodes=NodeAccess(TOKEN))
        stack.callback(store.close)
        _wait(
            lambda: sum(c.warm for c in store.warm_candidates(PoolKey("base"))) >= 1,
            60,
            "a warm sandbox",
        )
        config = E2bConfig(domain=DOMAIN, envd_secret=SECRET, api_keys={KEY: "default"})
        api_url = stack.enter_context(_serving(create_e2b_app(store, config)))
        # Create goes to the API only; envd traffic goes to the serve-proxy process.
        proxy_url = stack.enter_context(_serving(create_proxy_app(store, SECRET, DOMAIN)))
        self.sdk = {"api_key": KEY, "api_url": api_url, "sandbox_url": proxy_url}
        self.sandbox = Sandbox.create(**self.sdk)
        stack.callback(self.sandbox.kill)
        row = next(
            r
            for r in agent.sandboxes()
            if SandboxId.of_claim(r.id).public == self.sandbox.sandbox_id
        )
        self.claim_id, self.claim_token = row.id, agent.get(row.id).token or ""
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


def _round_trips(stack: _Stack, proxy_url: str) -> Iterator[Row]:
    from e2b import Sandbox

    sandbox = Sandbox.connect(stack.sandbox.sandbox_id, **{**stack.sdk, "sandbox_url": proxy_url})
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
        httpx.Client(base_url=proxy_url, headers={**rpc, **stack.proxy_headers()}) as px,
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


def _throughput(stack: _Stack, proxy_url: str) -> Iterator[Row]:
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
        f"{what}, via serve-proxy",
        ops_per_s=round(proxy_ops),
        **proxy_t.figures("ms", minimum=False),
    )
    ratio = proxy_ops / direct_ops
    yield _row(
        f"{what}, serve-proxy/direct",
        ratio=round(ratio, 3),
        added_p50_ms=round((proxy_t.p50_ns - direct_t.p50_ns) / 1e6, 3),
        target="throughput >= 60 % of direct",
        met=ratio >= 0.6,
    )


# --- 3. RSS during a 200 MiB upload ------------------------------------------------------


@contextmanager
def _proxy_process(stack: _Stack) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``sandboxctl serve-proxy`` over the same agent, as its own process."""
    url = f"http://127.0.0.1:{free_port()}"

    def routes() -> bool:
        return _answers(
            lambda: httpx.post(
                f"{url}/process.Process/List",
                content=b"{}",
                headers={**stack.proxy_headers(), "Content-Type": "application/json"},
                timeout=2,
            ).raise_for_status()
        )

    command = [
        "serve-proxy",
        "--domain", DOMAIN,
        "--e2b-envd-secret-file", str(stack.folder / "secret"),
        "--sandboxd-seeds", stack.agent_address,
        "--sandboxd-token-file", str(stack.folder / "token"),
        "--inventory-poll", f"{POLL.total_seconds():g}s",
        "--listen", url.removeprefix("http://"),
    ]  # fmt: skip
    with _service(stack.folder, "serve-proxy", command, routes) as process:
        yield process, url


@contextmanager
def _service(
    folder: Path,
    name: str,
    arguments: list[str],
    ready: Callable[[], bool],
    build: Path | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """``sandboxctl ARGUMENTS`` as its own process (as deployed), once ``ready``; stopped
    with SIGTERM on exit. ``build``: a directory holding another build's ``sandboxctl``
    (``oldtree.extract``), run instead of this one."""
    log_path = folder / f"{name}.log"
    env = None
    if build is not None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "sandboxctl", *arguments],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=build,  # first on sys.path with -m
            env=env,
        )
    try:

        def started() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited: {log_path.read_text()[-2000:]}")
            return ready()

        _wait(started, 60, f"{name} to answer")
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _answers(call: Callable[[], object]) -> bool:
    try:
        call()
    except (httpx.HTTPError, OSError, SandboxctlError):  # the agent's client: AgentApiError
        return False
    return True


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


@contextmanager
def _serving(app: Any, port: int = 0) -> Iterator[str]:
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="error", lifespan="off", loop="asyncio"
    )
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

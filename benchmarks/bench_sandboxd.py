"""The host agent with real bubblewrap sandboxes, over real HTTP on 127.0.0.1.

One :class:`Agent` with the :class:`BubblewrapRuntime` (no background loops: the benchmark
calls ``refill_once()`` itself), served by uvicorn in a thread of this process with a root
token, reached through :class:`AgentClient` (httpx, one kept-alive connection). Needs
root and bubblewrap; otherwise a single ``skipped`` row says why. Cases:

- ``GET /v1/info (http, baseline)``: the cost of a request that does almost nothing;
- ``warm claim (http)``: ``POST /v1/claim`` for the pool ``base`` (target 20), in batches
  of 20 with ``refill_once()`` between batches; every claim is checked to have taken a
  sandbox that was in the warm list just before (``warm`` = how many did);
- ``release (http)``: ``POST /v1/sandboxes/ID/release`` of those claims (destroys them);
- ``cold claim (http)``: claims of ``base/none/medium``, a key with no warm pool, so each
  one starts a sandbox while the client waits; each is released (not timed) before the next;
- ``warm claim`` / ``release (in-process)``: ``agent.claim`` / ``agent.release`` called
  directly, same batches; the ``http/in-process`` rows divide the p50s, i.e. what FastAPI,
  uvicorn and httpx add. Client and server share this process (and its GIL), so the HTTP
  figures include some contention a separate client process would not see;
- ``idle memory per sandbox``: 20 idle warm sandboxes; per sandbox the VmRSS and the PSS
  (``/proc/PID/smaps_rollup``) summed over its processes (found by its uid, unique per
  sandbox: the outer bwrap, the namespace's init bwrap and ``sleep``), p50 and max over
  sandboxes, plus the memory cgroup's ``memory.usage_in_bytes`` when there is one
  (``runs`` = sandboxes). RSS counts the shared pages of bwrap and libc in every sandbox;
  PSS splits them;
- ``start (refill 30)``: ``refill_once()`` for a target of 30 from empty; ``ops_per_s`` =
  30 / elapsed (the table shows it as ``ops_per`` in ``s``: read starts per second), and
  p50/p99 of one ``runtime.start`` within it;
- ``cleanup``: processes of the benchmark's uids left after ``agent.stop(destroy=True)``;
- ``... (in-process, home limit)`` / ``(in-process, host-dir home)``: warm claim, release
  and cold claim (``medium``) p50 of two agents side by side, in alternating rounds: one as
  it runs now (each home a tmpfs of its size class's ``home_bytes``), one with the home
  bound from a host directory, as before the limit. The ratio rows compare them (warm
  claim within 10 %, release no worse) and give the cold start's cost in ms.
"""

from __future__ import annotations

import contextlib
import gc
import os
import secrets
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

from benchmarks import Row, with_target
from benchmarks.timing import Timing, measure
from sandboxctl.agentapi import AgentClient, ClaimRequest
from sandboxctl.core.model import PoolKey
from sandboxctl.sandboxd.agent import Agent, AgentSettings
from sandboxctl.sandboxd.api import create_app
from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime, make_home
from sandboxctl.sandboxd.runtime import Identity, RuntimeFailure, SandboxSpec

NAME = "sandboxd"
WARM = PoolKey("base")  # base/none/small
COLD = PoolKey("base", "none", "medium")  # never given a warm pool
BATCH = 20  # warm pool target while claims are measured
HTTP_BATCHES = 5  # 100 warm claims over HTTP
INPROC_BATCHES = 3  # 60 in-process
COLD_CLAIMS = 30
IDLE_SANDBOXES = 20
REFILL_TARGET = 30
MAX_SANDBOXES = 64
# Host uids: outside the test suite's 400_000 + (pid % 1000) * 1000 blocks and the
# agent's default 200_000, unique per benchmark process. Destroy kills every process
# of a sandbox's uid, so this range must never be shared with another agent.
UID_BLOCK = 100
UID_BASE = 3_000_000 + (os.getpid() % 10_000) * UID_BLOCK

CLAIM_TARGET_MS = 5.0
HOME_AGENT_MAX = 40  # each of the two agents of the home-limit comparison
HOME_ROUNDS = 4  # alternating rounds of a batch of warm claims and the cold ones
HOME_COLD_CLAIMS = 8
RSS_TARGET_MB = 5.0
MEMORY_CGROUP = Path("/sys/fs/cgroup/memory/sandboxctl")


def run() -> Iterator[Row]:
    reason = _unavailable()
    if reason is not None:
        yield _row("skipped", reason=reason)
        return
    state_dir = Path(tempfile.mkdtemp(prefix="sandboxctl-bench-", dir="/tmp"))
    state_dir.chmod(0o711)  # sandbox uids traverse it to their homes
    runtime = _TimedRuntime(BubblewrapRuntime())
    settings = AgentSettings(
        node="bench",
        advertise_addr="127.0.0.1:0",
        state_dir=state_dir,
        max_sandboxes=MAX_SANDBOXES,
        pools={WARM: BATCH},
        uid_base=UID_BASE,
    )
    agent = Agent(settings, runtime)
    try:
        yield from _bench(agent, runtime)
    finally:
        try:
            agent.stop(destroy=True)
        finally:
            shutil.rmtree(state_dir, ignore_errors=True)
            leftover = _uid_pids()
            if leftover:
                print(
                    f"benchmarks: sandboxd left {sum(map(len, leftover.values()))} processes "
                    f"of uids {sorted(leftover)}",
                    file=sys.stderr,
                )
    yield with_target(
        _row("cleanup", leftover=sum(map(len, leftover.values()))), not leftover, "0 left"
    )
    yield from _home_limit()


def _bench(agent: Agent, runtime: _TimedRuntime) -> Iterator[Row]:
    token = secrets.token_urlsafe(24)
    with _serving(agent, token) as address, AgentClient(address, token=token) as client:
        client.info()  # open the connection, warm up the routes
        baseline = measure(client.info, runs=100, warmup=5, max_seconds=1.0)
        yield _row("GET /v1/info (http, baseline)", **baseline.figures("ms"))
        claim_http, release_http, warm_http = _warm_claims(
            agent,
            HTTP_BATCHES,
            claim=lambda: client.claim(ClaimRequest(WARM.template)).id,
            release=client.release,
        )
        yield _claim_row("warm claim (http)", claim_http, warm_http)
        yield _row("release (http)", **release_http.figures("ms"))

        cold, cold_release = [], []
        for _ in range(COLD_CLAIMS):
            start = time.perf_counter_ns()
            sandbox_id = client.claim(ClaimRequest(COLD.template, size=COLD.size)).id
            cold.append(time.perf_counter_ns() - start)
            start = time.perf_counter_ns()
            client.release(sandbox_id)
            cold_release.append(time.perf_counter_ns() - start)
        yield _row(f"cold claim (http, {COLD.size})", **_timing(cold).figures("ms"))
        yield _row(f"release cold (http, {COLD.size})", **_timing(cold_release).figures("ms"))

    claim_local, release_local, warm_local = _warm_claims(
        agent,
        INPROC_BATCHES,
        claim=lambda: agent.claim(ClaimRequest(WARM.template)).id,
        release=agent.release,
    )
    yield _claim_row("warm claim (in-process)", claim_local, warm_local)
    yield _row("release (in-process)", **release_local.figures("ms"))
    for case, http, local in (
        ("warm claim http/in-process", claim_http, claim_local),
        ("release http/in-process", release_http, release_local),
    ):
        yield _row(case, ratio=round(http.p50_ns / local.p50_ns, 1))

    yield _idle_memory(agent)

    agent.set_pools({})  # drain: the next refill starts from empty
    assert not agent.info().pools, agent.info()
    agent.set_pools({WARM: REFILL_TARGET})
    runtime.starts_ns.clear()
    gc.collect()
    start = time.perf_counter_ns()
    started = agent.refill_once()
    elapsed = (time.perf_counter_ns() - start) / 1e9
    assert started == REFILL_TARGET, started
    yield _row(
        f"start (refill {REFILL_TARGET}, {runtime.inner.limits_mode})",
        **_timing(runtime.starts_ns).figures("ms"),
        ops_per_s=round(started / elapsed, 1),
    )


def _warm_claims(
    agent: Agent, batches: int, claim: Any, release: Any
) -> tuple[Timing, Timing, int]:
    """``batches`` x BATCH claims, each from a full warm pool; then their releases."""
    agent.set_pools({WARM: BATCH})
    claims: list[float] = []
    releases: list[float] = []
    warm = 0
    for _ in range(batches):
        agent.refill_once()
        gc.collect()
        ids = []
        for _ in range(BATCH):
            before = set(_warm_ids(agent))
            start = time.perf_counter_ns()
            sandbox_id = claim()
            claims.append(time.perf_counter_ns() - start)
            warm += sandbox_id in before
            ids.append(sandbox_id)
        for sandbox_id in ids:
            start = time.perf_counter_ns()
            release(sandbox_id)
            releases.append(time.perf_counter_ns() - start)
    return _timing(claims), _timing(releases), warm


def _claim_row(case: str, timing: Timing, warm: int) -> Row:
    row = _row(case, **timing.figures("ms"), warm=f"{warm}/{len(timing.samples_ns)}")
    met = timing.p50_ns / 1e6 <= CLAIM_TARGET_MS and warm == len(timing.samples_ns)
    return with_target(row, met, f"p50 <= {CLAIM_TARGET_MS:g} ms, all warm")


def _idle_memory(agent: Agent) -> Row:
    agent.set_pools({WARM: IDLE_SANDBOXES})
    agent.refill_once()
    time.sleep(0.2)  # let the last ones settle into sleep
    records = [_record(agent, sandbox_id) for sandbox_id in _warm_ids(agent)]
    by_uid = _uid_pids()
    rss, pss, cgroup, procs = [], [], [], []
    for record in records:
        pids = by_uid.get(record.uid, [])
        procs.append(len(pids))
        rss.append(sum(_status_kb(pid, "VmRSS") for pid in pids) / 1024)
        pss.append(sum(_rollup_kb(pid, "Pss") for pid in pids) / 1024)
        usage = MEMORY_CGROUP / record.id / "memory.usage_in_bytes"
        if usage.is_file():
            cgroup.append(int(usage.read_text()) / 2**20)
    rss.sort()
    pss.sort()
    cgroup.sort()
    p50_rss = _p50(rss)
    nprocs = f"{min(procs)}-{max(procs)}" if min(procs) != max(procs) else str(procs[0])
    row = _row(
        f"idle memory per sandbox ({nprocs} procs)",
        rss_mb=round(p50_rss, 2),
        rss_max_mb=round(rss[-1], 2),
        pss_mb=round(_p50(pss), 2),
        cgroup_mb=round(_p50(cgroup), 2) if cgroup else None,
        runs=len(records),
    )
    return with_target(row, p50_rss <= RSS_TARGET_MB, f"RSS <= {RSS_TARGET_MB:g} MB")


# --- the home limit, before and after ------------------------------------------------------


class _HostHomeRuntime(BubblewrapRuntime):
    """The runtime as it was before the home limit: /home/user bound from a host
    directory, unbounded (for the side-by-side figures only)."""

    def _home_mounts(self, spec: SandboxSpec) -> list[str]:
        return ["--tmpfs", "/home", "--bind", str(spec.home), "/home/user"]

    def start(self, spec: SandboxSpec) -> Identity:
        make_home(spec)
        return super().start(spec)


def _home_limit() -> Iterator[Row]:
    """Warm claim, release and cold claim p50, in-process, for an agent whose homes are
    bounded tmpfs (now) and one whose homes are host directories (before), measured in
    alternating rounds so both see the same machine."""
    variants = {"home limit": BubblewrapRuntime(), "host-dir home": _HostHomeRuntime()}
    samples: dict[str, dict[str, list[float]]] = {
        name: {"warm": [], "release": [], "cold": []} for name in variants
    }
    with contextlib.ExitStack() as stack:
        agents = {}
        for offset, (name, runtime) in enumerate(variants.items()):
            state = Path(tempfile.mkdtemp(prefix="sandboxctl-bench-home-", dir="/tmp"))
            state.chmod(0o711)
            stack.callback(shutil.rmtree, state, ignore_errors=True)
            settings = AgentSettings(
                node="bench",
                advertise_addr="127.0.0.1:0",
                state_dir=state,
                max_sandboxes=HOME_AGENT_MAX,
                pools={WARM: BATCH},
                uid_base=UID_BASE + offset * UID_BLOCK // 2,
            )
            agents[name] = Agent(settings, runtime)
            stack.callback(agents[name].stop, destroy=True)
        for round_ in range(HOME_ROUNDS):
            order = list(agents.items())
            for name, agent in order[::-1] if round_ % 2 else order:  # neither always first
                claims, releases, _ = _warm_claims(
                    agent, 1, claim=lambda a=agent: a.claim(ClaimRequest(WARM.template)).id,
                    release=agent.release,
                )  # fmt: skip
                samples[name]["warm"] += claims.samples_ns
                samples[name]["release"] += releases.samples_ns
                for _ in range(HOME_COLD_CLAIMS):
                    start = time.perf_counter_ns()
                    sandbox_id = agent.claim(ClaimRequest(COLD.template, size=COLD.size)).id
                    samples[name]["cold"].append(time.perf_counter_ns() - start)
                    agent.release(sandbox_id)
    now, before = (
        {kind: _timing(values) for kind, values in samples[name].items()} for name in variants
    )
    for kind, label in (("warm", "warm claim"), ("release", "release"), ("cold", "cold claim")):
        yield _row(f"{label} (in-process, home limit)", **now[kind].figures("ms"))
        yield _row(f"{label} (in-process, host-dir home)", **before[kind].figures("ms"))
    warm = now["warm"].p50_ns / before["warm"].p50_ns
    yield with_target(
        _row("warm claim home limit/host-dir", ratio=round(warm, 2)), warm <= 1.1, "<= 1.10"
    )
    release = now["release"].p50_ns / before["release"].p50_ns
    yield with_target(
        _row("release home limit/host-dir", ratio=round(release, 2)), release <= 1.0, "<= 1.00"
    )
    cost = (now["cold"].p50_ns - before["cold"].p50_ns) / 1e6
    yield _row(
        "cold claim home limit/host-dir",
        ratio=round(now["cold"].p50_ns / before["cold"].p50_ns, 2),
        cost_ms=round(cost, 2),
    )


# --- helpers ------------------------------------------------------------------------------


class _TimedRuntime:
    """The real runtime, with the duration of every ``start`` recorded."""

    def __init__(self, inner: BubblewrapRuntime) -> None:
        self.inner = inner
        self.name = inner.name
        self.isolated = inner.isolated
        self.starts_ns: list[float] = []

    def start(self, spec: SandboxSpec) -> Identity:
        start = time.perf_counter_ns()
        identity = self.inner.start(spec)
        self.starts_ns.append(time.perf_counter_ns() - start)
        return identity

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (each sandbox runs as its own host uid)"
    missing = [t for t in BubblewrapRuntime.TOOLS if shutil.which(t) is None]
    if missing:
        return f"missing {', '.join(missing)}"
    try:
        BubblewrapRuntime.check()
    except RuntimeFailure as exc:
        return str(exc)
    taken = _uid_pids()
    if taken:
        return f"uids {sorted(taken)} already have processes"
    return None


@contextmanager
def _serving(agent: Agent, token: str | None) -> Iterator[str]:
    """Serve the agent on a free loopback port from a thread; yields ``host:port``."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(agent, token),
        host="127.0.0.1",
        port=port,
        log_level="error",
        access_log=False,
        lifespan="off",
        loop="asyncio",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="bench-sandboxd", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the agent's HTTP server did not start")
        time.sleep(0.01)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _warm_ids(agent: Agent) -> list[str]:
    # The pools are read under the agent's lock (info() only counts warm ids).
    with agent._lock:
        return agent.pools.warm(WARM)


def _record(agent: Agent, sandbox_id: str) -> Any:
    with agent._lock:
        return agent._records[sandbox_id]


def _uid_pids() -> dict[int, list[int]]:
    """Live processes whose real uid is in the benchmark's uid block, by uid."""
    found: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            status = Path("/proc", name, "status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        uid = state = None
        for line in status.splitlines():
            if line.startswith("Uid:"):
                uid = int(line.split()[1])
            elif line.startswith("State:"):
                state = line.split()[1]
        if uid is not None and UID_BASE <= uid < UID_BASE + UID_BLOCK and state not in ("Z", "X"):
            found.setdefault(uid, []).append(int(name))
    return found


def _status_kb(pid: int, field: str) -> int:
    return _kb(Path("/proc", str(pid), "status"), field)


def _rollup_kb(pid: int, field: str) -> int:
    return _kb(Path("/proc", str(pid), "smaps_rollup"), field)


def _kb(path: Path, field: str) -> int:
    try:
        text = path.read_text()
    except (FileNotFoundError, ProcessLookupError):
        return 0
    for line in text.splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


def _timing(samples_ns: Iterable[float]) -> Timing:
    return Timing(tuple(sorted(samples_ns)))


def _p50(values: list[float]) -> float:
    return _timing(values).percentile(50) if values else 0.0


def _row(case: str, **figures: object) -> Row:
    return {"benchmark": NAME, "case": case, **figures}

"""What the tenancy hardening costs and bounds, on real agents, beside the build before it.

Two host agents run as their own processes (``sandboxctl serve-sandboxd``, bubblewrap, a
warm pool): this build's and commit :data:`OLD_COMMIT`'s (the last before it: its
``sandboxctl`` tree extracted by ``git archive``), each with this build's e2b API and envd
proxy in this process over a mesh inventory of it.

1. Round trips, in :data:`PAIRS` interleaved pairs (alternating which build goes first):
   a warm claim over the agent's HTTP API (``POST /v1/claim``, the pool refilled between
   claims), the unmodified SDK's ``commands.run("true")``, ``files.write`` of 1 KiB and
   ``files.read`` of it, through the proxy. Each figure: the median over the pairs of
   after/before p50. Target: no worse (ratio <= 1, within the noise of a shared machine).
2. A flood nobody reads: a sandbox of this build writes ``head -c 4G /dev/zero`` to a
   Connect stream whose client reads the first message and nothing more. The agent's
   VmRSS is sampled until the writer is held (what it has written stops growing for a
   second) and for :data:`HOLD_SECONDS` after; a neighbour's ``commands.run("true")`` p50
   is taken idle and during the flood. Targets: RSS growth <= 64 MiB; neighbour p50 <= 1.5
   x idle. The old build is flooded with :data:`OLD_FLOOD_BYTES` only (it buffers all of
   it: its growth is the contrast).
3. The same neighbour figure while an SDK client reads a 1 GiB flood as fast as it can
   (reported: this is CPU the flood takes from a shared machine, not memory).

Skipped (one row) without root and bubblewrap, or without the old commit.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

from benchmarks import Row, oldtree
from benchmarks.bench_envd import _answers, _rss_kb, _service, _serving, _wait
from benchmarks.timing import Timing
from sandboxctl.lanes.processes import free_port

OLD_COMMIT = "2ef418b"
KEY = "e2b_" + "f" * 40
TOKEN = "bench-tenancy-root-token"
SECRET = b"bench-tenancy-envd-secret"
DOMAIN = "bench.test"
WARM = 3
PAIRS = 5
RUNS = 40  # per figure, per build, per pair
CLAIMS = 20  # per build, per pair (each waits for the pool to refill)
FLOOD_BYTES = 4 << 30
OLD_FLOOD_BYTES = 512 << 20
READ_FLOOD_BYTES = 1 << 30
HOLD_SECONDS = 5.0
NEIGHBOUR_RUNS = 40
UID_BASE = 8_500_000 + (os.getpid() % 10_000) * 64
POLL = timedelta(seconds=1)


def run() -> Iterator[Row]:
    reason = _unavailable()
    if reason is not None:
        yield _row("tenancy", skipped=reason)
        return
    with ExitStack() as stack:
        folder = Path(tempfile.mkdtemp(prefix="sandboxctl-bench-tenancy-", dir="/tmp"))
        folder.chmod(0o711)  # sandbox uids traverse it to their homes
        stack.callback(shutil.rmtree, folder, ignore_errors=True)
        (folder / "old").mkdir()
        why = oldtree.extract(OLD_COMMIT, folder / "old")
        if why is not None:
            yield _row("tenancy", skipped=why)
            return
        after = _Build.start(stack, folder, "after", None, UID_BASE)
        before = _Build.start(stack, folder, "before", folder / "old", UID_BASE + 32)
        yield from _round_trips(before, after)
        yield from _flood_unread(after, FLOOD_BYTES)
        yield from _flood_unread(before, OLD_FLOOD_BYTES)
        yield from _flood_read(after)


def _row(case: str, **figures: Any) -> Row:
    return {"benchmark": "tenancy", "case": case, **figures}


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "real sandboxes need root"
    missing = [t for t in ("bwrap", "setpriv", "nsenter", "git") if shutil.which(t) is None]
    return f"missing {', '.join(missing)}" if missing else None


class _Build:
    """One build's agent process, with this build's e2b API and proxy over it."""

    def __init__(self, name: str, folder: Path) -> None:
        self.name = name
        self.folder = folder
        self.address = ""
        self.sdk: dict[str, Any] = {}
        self.pid = 0

    @classmethod
    def start(
        cls, stack: ExitStack, parent: Path, name: str, tree: Path | None, uid_base: int
    ) -> _Build:
        from sandboxctl.agentapi import AgentClient
        from sandboxctl.apiserver.e2b import E2bConfig, create_e2b_app
        from sandboxctl.core.freshness import FreshnessRule
        from sandboxctl.core.model import PoolKey
        from sandboxctl.inventory.mesh import MeshInventorySource
        from sandboxctl.proxy import create_proxy_app
        from sandboxctl.store import SandboxStore
        from sandboxctl.store.nodes import NodeAccess

        self = cls(name, parent / name)
        self.folder.mkdir(mode=0o711)
        (self.folder / "token").write_text(TOKEN)
        (self.folder / "token").chmod(0o600)
        self.address = f"127.0.0.1:{free_port()}"
        agent = AgentClient(f"http://{self.address}", TOKEN)
        stack.callback(agent.close)
        command = [
            "serve-sandboxd",
            "--node", f"bench-{name}",
            "--listen", self.address,
            "--state-dir", str(self.folder / "state"),
            "--token-file", str(self.folder / "token"),
            "--pool", f"base={WARM}",
            "--max-sandboxes", str(WARM + 6),
            "--uid-base", str(uid_base),
            "--destroy-on-exit",
        ]  # fmt: skip
        # After the agent stops (callbacks run last first): the old build's runtime dir
        # has no owner lock, so no later start would collect it.
        stack.callback(_remove_runtime_dir, self.folder / "state")
        process = stack.enter_context(
            _service(self.folder, "sandboxd", command, lambda: _answers(agent.info), tree)
        )
        self.pid = process.pid
        source = MeshInventorySource([self.address], TOKEN, poll_interval=POLL)
        source.start()
        stack.callback(source.stop)
        store = SandboxStore(source, FreshnessRule(), nodes=NodeAccess(TOKEN))
        stack.callback(store.close)
        _wait(
            lambda: sum(c.warm for c in store.warm_candidates(PoolKey("base"))) >= WARM,
            120,
            f"the {name} build's warm pool",
        )
        config = E2bConfig(domain=DOMAIN, envd_secret=SECRET, api_keys={KEY: "default"})
        api_url = stack.enter_context(_serving(create_e2b_app(store, config)))
        proxy_url = stack.enter_context(_serving(create_proxy_app(store, SECRET, DOMAIN)))
        self.sdk = {"api_key": KEY, "api_url": api_url, "sandbox_url": proxy_url}
        return self

    def agent(self) -> Any:
        from sandboxctl.agentapi import AgentClient

        return AgentClient(f"http://{self.address}", TOKEN)

    def sandbox(self) -> Any:
        """A sandbox of the SDK's, once the API has seen a warm one."""
        from e2b import Sandbox
        from e2b.exceptions import ServiceBusyException

        deadline = time.monotonic() + 60
        while True:
            try:
                return Sandbox.create(**self.sdk)
            except ServiceBusyException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def pool_full(self) -> bool:
        with self.agent() as agent:
            return all(pool.warm >= pool.target for pool in agent.info().pools)


def _remove_runtime_dir(state_dir: Path) -> None:
    link = state_dir / "runtime"
    if link.is_symlink():
        shutil.rmtree(link.resolve(), ignore_errors=True)


# --- 1. round trips, interleaved ----------------------------------------------------------


def _round_trips(before: _Build, after: _Build) -> Iterator[Row]:
    sandboxes = {build.name: build.sandbox() for build in (before, after)}
    try:
        p50s: dict[str, dict[str, list[float]]] = {}
        for pair in range(PAIRS):
            order = (before, after) if pair % 2 == 0 else (after, before)
            for build in order:
                for figure, ms in _figures(build, sandboxes[build.name]).items():
                    p50s.setdefault(figure, {}).setdefault(build.name, []).append(ms)
        for figure, sides in p50s.items():
            ratios = [a / b for a, b in zip(sides["after"], sides["before"], strict=True)]
            ratio = statistics.median(ratios)
            yield _row(
                figure,
                before_p50_ms=round(statistics.median(sides["before"]), 2),
                after_p50_ms=round(statistics.median(sides["after"]), 2),
                ratio=round(ratio, 3),
                runs=PAIRS,
                target="after/before <= 1 (no worse)",
                met=ratio <= 1.05,  # the noise of one shared 2-core machine
            )
    finally:
        for sandbox in sandboxes.values():
            sandbox.kill()


def _figures(build: _Build, sandbox: Any) -> dict[str, float]:
    """p50 in ms of each figure, one batch."""
    from sandboxctl.agentapi import ClaimRequest

    claims = []
    with build.agent() as agent:
        for _ in range(CLAIMS):
            _wait(build.pool_full, 60, "the pool to refill")
            begin = time.perf_counter_ns()
            grant = agent.claim(ClaimRequest("base"))
            claims.append(time.perf_counter_ns() - begin)
            agent.release(grant.id)
    small = os.urandom(1024)
    figures = {
        "warm claim over HTTP (POST /v1/claim)": claims,
        'SDK commands.run("true") via proxy': _times(lambda: sandbox.commands.run("true")),
        "SDK files.write 1 KiB via proxy": _times(lambda: sandbox.files.write("/tmp/f", small)),
        "SDK files.read 1 KiB via proxy": _times(lambda: sandbox.files.read("/tmp/f")),
    }
    return {name: Timing(tuple(sorted(s))).p50_ns / 1e6 for name, s in figures.items()}


def _times(call: Callable[[], object], runs: int = RUNS) -> list[float]:
    call()  # warm
    samples = []
    for _ in range(runs):
        begin = time.perf_counter_ns()
        call()
        samples.append(time.perf_counter_ns() - begin)
    return samples


# --- 2. a flood nobody reads ---------------------------------------------------------------


def _flood_unread(build: _Build, size: int) -> Iterator[Row]:
    flooded, neighbour = build.sandbox(), build.sandbox()
    try:
        idle = Timing(tuple(sorted(_times(lambda: neighbour.commands.run("true"), NEIGHBOUR_RUNS))))
        uid = int(flooded.commands.run("id -u").stdout)
        baseline = _rss_kb(build.pid)
        peak = baseline
        # The SDK's background command: its stream is read only when asked (never here);
        # held until the end (dropped, it would close the stream: nobody would listen).
        handle = flooded.commands.run(f"head -c {size} /dev/zero", background=True, timeout=0)
        begin = time.monotonic()
        held_since = None
        last: dict[int, int] = {}
        flood: list[float] = []
        while time.monotonic() - begin < 120:
            peak = max(peak, _rss_kb(build.pid))
            flood += _times(lambda: neighbour.commands.run("true"), 1)
            written = _written(uid, "head")
            if not written and last:
                break  # it wrote all of it and ended
            held = bool(written) and written == last
            held_since = (held_since or time.monotonic()) if held else None
            last = written
            if held_since is not None and time.monotonic() - held_since > HOLD_SECONDS:
                break
        took = time.monotonic() - begin
        wrote = sum(last.values())
        handle.kill()
    finally:
        flooded.kill()
        neighbour.kill()
    during = Timing(tuple(sorted(flood)))
    growth = (peak - baseline) / 1024
    ratio = during.p50_ns / idle.p50_ns
    bounded = build.name == "after"
    yield _row(
        f"{build.name}: agent RSS, {size >> 20} MiB written to a stream nobody reads",
        rss_before_mb=round(baseline / 1024, 1),
        rss_peak_mb=round(peak / 1024, 1),
        rss_growth_mb=round(growth, 1),
        written_mb=round(wrote / (1 << 20), 1),
        observed_s=round(took, 1),
        **({"target": "growth <= 64 MiB", "met": growth <= 64} if bounded else {}),
    )
    yield _row(
        f'{build.name}: neighbour commands.run("true") during that flood',
        idle_p50_ms=round(idle.p50_ns / 1e6, 2),
        p50_ms=round(during.p50_ns / 1e6, 2),
        ratio=round(ratio, 2),
        runs=len(flood),
        **({"target": "p50 <= 1.5 x idle", "met": ratio <= 1.5} if bounded else {}),
    )


def _written(uid: int, name: str) -> dict[int, int]:
    """pid -> bytes written so far, of each process ``name`` of ``uid``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid or (entry / "comm").read_text().strip() != name:
                continue
            for line in (entry / "io").read_text().splitlines():
                if line.startswith("wchar:"):
                    found[int(entry.name)] = int(line.split()[1])
        except OSError:
            continue
    return found


# --- 3. a flood read as fast as it comes ----------------------------------------------------


def _flood_read(build: _Build) -> Iterator[Row]:
    flooded, neighbour = build.sandbox(), build.sandbox()
    try:
        idle = Timing(tuple(sorted(_times(lambda: neighbour.commands.run("true"), NEIGHBOUR_RUNS))))
        baseline = _rss_kb(build.pid)
        peak = baseline
        done = threading.Event()
        received = 0

        def read() -> None:
            nonlocal received

            def count(chunk: str) -> None:
                nonlocal received
                received += len(chunk)

            try:
                flooded.commands.run(
                    f"head -c {READ_FLOOD_BYTES} /dev/zero", on_stdout=count, timeout=0
                )
            finally:
                done.set()

        reader = threading.Thread(target=read, daemon=True)
        begin = time.monotonic()
        reader.start()
        during: list[float] = []
        while not done.is_set():
            peak = max(peak, _rss_kb(build.pid))
            during += _times(lambda: neighbour.commands.run("true"), 1)
        took = time.monotonic() - begin
        reader.join()
    finally:
        flooded.kill()
        neighbour.kill()
    timing = Timing(tuple(sorted(during)))
    yield _row(
        f'{build.name}: neighbour commands.run("true") while the SDK reads a '
        f"{READ_FLOOD_BYTES >> 20} MiB flood",
        idle_p50_ms=round(idle.p50_ns / 1e6, 2),
        p50_ms=round(timing.p50_ns / 1e6, 2),
        ratio=round(timing.p50_ns / idle.p50_ns, 2),
        rss_growth_mb=round((peak - baseline) / 1024, 1),
        flood_mib_per_s=round(received / (1 << 20) / took, 1),
        runs=len(during),
    )

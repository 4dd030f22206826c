"""Creates that never fail for want of a warm sandbox: bursts, and warm against cold.

The fleet is ``bench_e2b.real_fleet``: two real host agents (bubblewrap, served over
loopback HTTP), a mesh source polling them every 0.2 s, the store and the e2b app, driven
by the unmodified e2b SDK. Skipped without root and bubblewrap.

1. ``20 concurrent creates, 2 warm``: a warm pool of one ``base`` sandbox per node (2 in
   all), then 20 ``AsyncSandbox.create()`` at once, ten runs (the pools refill between
   runs, untimed). Every create must succeed: the two warm ones are taken, the other 18
   start cold on the node with the most free slots. Target: 0 failures.
2. ``create, warm`` against ``create, cold fallback``: one ``Sandbox.create()`` at a time
   while the inventories list a warm sandbox, then with every pool drained (so each create
   is a cold start placed by free slots), side by side.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

from benchmarks import Row, with_target
from benchmarks.bench_e2b import (
    BASE,
    KEY,
    e2b_config,
    real_fleet,
    serving,
    unavailable,
    wait_until,
    warm_count,
)
from benchmarks.timing import Timing
from sandboxctl.agentapi import AgentClient, PoolTarget
from sandboxctl.apiserver.e2b import create_e2b_app
from sandboxctl.store import SandboxStore

BURST = 20
RUNS = 10
SEQUENTIAL = 30
TOKEN = "bench-root-token"
UID_BASE = 6_000_000 + (os.getpid() % 10_000) * 64  # clear of bench_e2b and the tests


def run() -> Iterator[Row]:
    reason = unavailable()
    if reason is not None:
        yield {"benchmark": "capacity", "case": "creates", "skipped": reason}
        return
    with (
        real_fleet(warm=1, capacity=BURST + 4, uid_base=UID_BASE) as store,
        serving(create_e2b_app(store, e2b_config())) as url,
    ):
        params = {"api_key": KEY, "api_url": url, "sandbox_url": "http://127.0.0.1:9"}
        yield _burst(store, params)
        yield from _warm_against_cold(store, params)


def _burst(store: SandboxStore, params: dict[str, str]) -> Row:
    from e2b import AsyncSandbox, Sandbox

    async def one() -> tuple[float, str | None, str | None]:
        start = time.perf_counter_ns()
        try:
            sandbox = await AsyncSandbox.create(**params)
        except Exception as error:  # counted and reported, never raised
            return (time.perf_counter_ns() - start) / 1e6, None, type(error).__name__
        return (time.perf_counter_ns() - start) / 1e6, sandbox.sandbox_id, None

    async def burst() -> list[tuple[float, str | None, str | None]]:
        return await asyncio.gather(*(one() for _ in range(BURST)))

    samples: list[float] = []
    failures: list[str] = []
    for _ in range(RUNS):
        wait_until(lambda: warm_count(store) >= 2, 30)
        results = asyncio.run(burst())
        samples += [ms for ms, sandbox_id, _ in results if sandbox_id is not None]
        failures += [error for _, _, error in results if error is not None]
        for _, sandbox_id, _ in results:
            if sandbox_id is not None:
                Sandbox.kill(sandbox_id, **params)
    timing = Timing(tuple(sorted(samples)))
    row: Row = {
        "benchmark": "capacity",
        "case": f"{BURST} concurrent creates, 2 warm (x{RUNS})",
        "creates": BURST * RUNS,
        "failures": len(failures),
        "p50_ms": round(timing.percentile(50), 1),
        "p99_ms": round(timing.percentile(99), 1),
    }
    if failures:
        row["errors"] = ",".join(sorted(set(failures)))
    return with_target(row, not failures, "0 failures")


def _warm_against_cold(store: SandboxStore, params: dict[str, str]) -> Iterator[Row]:
    from e2b import Sandbox

    def timed_create() -> float:
        start = time.perf_counter_ns()
        sandbox = Sandbox.create(**params)
        elapsed = (time.perf_counter_ns() - start) / 1e6
        sandbox.kill()
        return elapsed

    warm: list[float] = []
    for _ in range(SEQUENTIAL):
        wait_until(lambda: warm_count(store) >= 2, 30)
        warm.append(timed_create())
    _set_pools(store, 0)
    wait_until(lambda: warm_count(store) == 0, 30)
    cold = [timed_create() for _ in range(SEQUENTIAL)]
    _set_pools(store, 1)
    warm_p50 = Timing(tuple(sorted(warm))).percentile(50)
    for case, samples in (("create, warm", warm), ("create, cold fallback", cold)):
        timing = Timing(tuple(sorted(samples)))
        yield {
            "benchmark": "capacity",
            "case": case,
            "p50_ms": round(timing.percentile(50), 1),
            "p99_ms": round(timing.percentile(99), 1),
            "runs": len(samples),
            "ratio": round(timing.percentile(50) / warm_p50, 2),
        }


def _set_pools(store: SandboxStore, warm: int) -> None:
    for node in store.fresh_nodes():
        address = store.address(node)
        assert address is not None
        with AgentClient(address, TOKEN) as client:
            client.set_pools([PoolTarget.of(BASE, warm)] if warm else [])

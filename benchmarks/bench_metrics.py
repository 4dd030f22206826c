"""What the request latency histograms (``serving.metrics``) cost.

1. ``cpu per warm create``: the unmodified e2b SDK's ``Sandbox.create()`` over loopback
   HTTP to the e2b app, over two real host agents in this process (bubblewrap, warm pools,
   as ``bench_e2b``), with every histogram on (the e2b API's and the agents') and with
   every one off, side by side in one run: the same agents serve both (a switch picks
   the agent app with or without them), and the two e2b apps are served at once. Modes
   alternate in blocks of 10 (on, off, off again, off again, off, on, ...; "off again"
   is off measured apart, the noise floor); before each timed create both nodes are
   warm again (untimed). The figure is this process's CPU time (``time.process_time``:
   the SDK, the e2b app, both agents and their loops) across the create, per create;
   compared by the mean without the highest and lowest tenth (on a shared host a few
   creates meet another process's burst), the plain mean and the median beside it.
   Target: on at most 2 % above off. Skipped without root and bubblewrap.
2. ``Timed per request``: the middleware alone around an app that answers at once,
   against that app bare; the difference per request, in microseconds. With the requests
   timed per create, it gives what the histograms should cost a create, free of the
   noise of the first figure (on a shared 2-core host, "off again" / "off" has been
   0.95 to 1.05).
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from benchmarks import Row
from benchmarks.bench_e2b import (
    BASE,
    KEY,
    TOKEN,
    UID_BASE,
    _serving_on,
    e2b_config,
    serving,
    unavailable,
    wait_until,
)
from sandboxctl.apiserver.e2b import create_e2b_app
from sandboxctl.lanes.processes import free_port
from sandboxctl.serving.metrics import NAME as HISTOGRAM
from sandboxctl.serving.metrics import RequestTimes, Timed
from sandboxctl.store import SandboxStore

WARM = 6
BLOCK = 10  # creates of one mode in a row
BLOCKS = 30  # per mode
TARGET = 1.02
TIMED_CASE = "requests timed while on, per create (the mesh polls included)"
ON, OFF, CONTROL = "histograms on", "histograms off", "histograms off again"
# Blocks of each mode in turn, so a drift of the host touches every mode alike; CONTROL
# is OFF measured apart, whose ratio to OFF is what noise alone gives.
ORDER = (ON, OFF, CONTROL, CONTROL, OFF, ON)


def run() -> Iterator[Row]:
    per_request = _timed_per_request()
    rows = list(_cpu_per_create())
    yield from rows
    yield _row("Timed per request (middleware alone)", cost_us=round(per_request * 1e6, 3))
    # What the histograms should cost a create by the two figures measured apart: every
    # request timed while on (polls included) at the middleware's own cost.
    figures = {row["case"]: row for row in rows}
    timed = figures.get(TIMED_CASE, {}).get("requests")
    off = figures.get(f"cpu per warm create, {OFF}", {}).get("trimmed_cpu_ms")
    if timed and off:
        yield _row(
            "estimate: requests timed x cost per request / cpu per create (off)",
            ratio=round(1 + timed * per_request * 1e3 / off, 4),
        )


def _row(case: str, **figures: Any) -> Row:
    return {"benchmark": "metrics", "case": case, **figures}


class _Switch:
    """One agent served by two apps, one with histograms, one without; ``on`` picks."""

    def __init__(self, with_histograms: Any, without: Any) -> None:
        self.apps = {True: with_histograms, False: without}
        self.on = True

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.apps[self.on](scope, receive, send)


@contextmanager
def _switched_fleet() -> Iterator[tuple[SandboxStore, list[_Switch]]]:
    """Two real agents, each behind a :class:`_Switch`; a store over them (as
    ``bench_e2b.real_fleet``, whose agents always serve one app)."""
    from sandboxctl.core.freshness import FreshnessRule
    from sandboxctl.inventory.mesh import MeshInventorySource
    from sandboxctl.lifecycle import Background
    from sandboxctl.sandboxd.agent import Agent, AgentSettings
    from sandboxctl.sandboxd.api import create_app
    from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime
    from sandboxctl.store.nodes import NodeAccess

    with ExitStack() as stack:
        addresses, switches = [], []
        for offset, node in enumerate(("bench-m-a", "bench-m-b")):
            state = Path(tempfile.mkdtemp(prefix=f"sandboxctl-bench-{node}-", dir="/tmp"))
            state.chmod(0o711)
            stack.callback(shutil.rmtree, state, ignore_errors=True)
            port = free_port()
            settings = AgentSettings(
                node=node,
                advertise_addr=f"127.0.0.1:{port}",
                state_dir=state,
                pools={BASE: WARM},
                uid_base=UID_BASE + 1024 + 32 * offset,
                max_sandboxes=WARM + 4,
            )
            agent = Agent(settings, BubblewrapRuntime())
            stack.callback(agent.stop, destroy=True)
            agent.start()
            for loop in agent.loops():
                Background(loop).start()
            switch = _Switch(create_app(agent, TOKEN), create_app(agent, TOKEN, False))
            stack.enter_context(_serving_on(switch, port))
            addresses.append(settings.advertise_addr)
            switches.append(switch)
        source = MeshInventorySource(addresses, TOKEN, poll_interval=timedelta(seconds=0.2))
        source.start()
        stack.callback(source.stop)
        nodes = NodeAccess(TOKEN)
        stack.callback(nodes.close)
        yield SandboxStore(source, FreshnessRule(), nodes=nodes), switches


def _cpu_per_create() -> Iterator[Row]:
    reason = unavailable()
    if reason is not None:
        yield _row("cpu per warm create", skipped=reason)
        return
    from e2b import Sandbox

    with ExitStack() as stack:
        store, switches = stack.enter_context(_switched_fleet())
        e2b_times = RequestTimes()
        urls = {
            ON: stack.enter_context(serving(create_e2b_app(store, e2b_config(), e2b_times))),
            OFF: stack.enter_context(serving(create_e2b_app(store, e2b_config()))),
        }
        urls[CONTROL] = urls[OFF]

        def full() -> bool:
            return sum(c.warm for c in store.warm_candidates(BASE)) >= 2 * WARM

        cpu: dict[str, list[float]] = {ON: [], OFF: [], CONTROL: []}
        for mode in ORDER * (BLOCKS // 2):
            for switch in switches:
                switch.on = mode == ON
            for _ in range(BLOCK):
                wait_until(full, 60)
                started = time.process_time()
                sandbox = Sandbox.create(
                    api_key=KEY, api_url=urls[mode], sandbox_url="http://127.0.0.1:9"
                )
                cpu[mode].append(time.process_time() - started)
                sandbox.kill()
        timed = _observed(e2b_times.registry) + sum(
            _observed(s.apps[True].state.metrics.registry) for s in switches
        )
    for mode in (ON, OFF, CONTROL):
        yield _row(
            f"cpu per warm create, {mode}",
            trimmed_cpu_ms=round(_trimmed(cpu[mode]) * 1e3, 3),
            mean_cpu_ms=round(statistics.fmean(cpu[mode]) * 1e3, 3),
            median_cpu_ms=round(statistics.median(cpu[mode]) * 1e3, 3),
            stdev_ms=round(statistics.stdev(cpu[mode]) * 1e3, 3),
            runs=len(cpu[mode]),
        )
    for case, mode in (("on / off", ON), ("noise: off again / off", CONTROL)):
        ratio = _trimmed(cpu[mode]) / _trimmed(cpu[OFF])
        row = _row(
            f"cpu per warm create, {case}",
            trimmed_ratio=round(ratio, 4),
            mean_ratio=round(statistics.fmean(cpu[mode]) / statistics.fmean(cpu[OFF]), 4),
            median_ratio=round(statistics.median(cpu[mode]) / statistics.median(cpu[OFF]), 4),
        )
        if mode == ON:
            row.update(target=f"trimmed <= {TARGET} (at most 2 % more)", met=ratio <= TARGET)
        yield row
    yield _row(TIMED_CASE, requests=round(timed / len(cpu[ON]), 2))


def _trimmed(samples: list[float]) -> float:
    """The mean without the highest and the lowest tenth: a create that shared the CPU
    with another process's burst (or this one's refill) weighs no more than the rest."""
    ordered = sorted(samples)
    cut = len(ordered) // 10
    return statistics.fmean(ordered[cut : len(ordered) - cut])


def _observed(registry: Any) -> float:
    """How many requests the histograms of ``registry`` have timed."""
    return float(
        sum(
            sample.value
            for family in registry.collect()
            if family.name == HISTOGRAM
            for sample in family.samples
            if sample.name == f"{HISTOGRAM}_count"
        )
    )


def _timed_per_request(requests: int = 200_000) -> float:
    """The CPU seconds ``Timed`` adds to a request, around an app that answers at once."""

    async def answer(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    observe = RequestTimes().of("bench")
    timed = Timed(answer, observe)
    scope = {"type": "http", "method": "GET", "path": "/x"}

    async def drive(app: Any) -> float:
        async def send(_: Any) -> None:
            return None

        async def receive() -> Any:
            return {"type": "http.request"}

        started = time.process_time()
        for _ in range(requests):
            await app(scope, receive, send)
        return time.process_time() - started

    bare = min(asyncio.run(drive(answer)) for _ in range(3))
    with_timing = min(asyncio.run(drive(timed)) for _ in range(3))
    return (with_timing - bare) / requests

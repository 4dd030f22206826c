"""The agent's usage sampler: CPU time per sandbox sample.

A real host agent (bubblewrap) with 10 claimed sandboxes, each running a small busy
process; the sampler's own CPU time (``time.thread_time_ns``) over 30 passes, divided by
the samples taken. Target: under 1 ms of CPU per sample (a pass every 5 s over 64
sandboxes is then under 1.3 % of one CPU). Skipped without root and bubblewrap.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from benchmarks import Row, with_target
from benchmarks.bench_e2b import unavailable

SANDBOXES = 10
PASSES = 30
UID_BASE = 6_100_000 + (os.getpid() % 10_000) * 16


def run() -> Iterator[Row]:
    reason = unavailable()
    if reason is not None:
        yield {"benchmark": "sampling", "case": "usage sample", "skipped": reason}
        return
    from sandboxctl.agentapi import ClaimRequest
    from sandboxctl.envd.host import Command
    from sandboxctl.sandboxd import entering
    from sandboxctl.sandboxd.agent import Agent, AgentSettings
    from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime

    state = Path(tempfile.mkdtemp(prefix="sandboxctl-bench-sampling-", dir="/tmp"))
    state.chmod(0o711)
    settings = AgentSettings(
        node="bench", advertise_addr="127.0.0.1:1", state_dir=state, uid_base=UID_BASE
    )
    agent = Agent(settings, BubblewrapRuntime())
    busy: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(SANDBOXES):
            record = agent.claim(ClaimRequest(template="base"))
            entry = agent.runtime.enter(
                agent.spec(record),
                agent.identity(record),
                Command(["/bin/sh", "-c", "yes >/dev/null"]),
            )
            busy.append(entering.popen(entry))
        for _ in range(PASSES):
            agent.usage.sample_once()
        cost = agent.usage.cost
        per_sample = cost.cpu_us_per_sample
        yield with_target(
            {
                "benchmark": "sampling",
                "case": f"usage sample ({SANDBOXES} busy sandboxes, cgroups)",
                "samples": cost.samples,
                "cpu_us_per_sample": round(per_sample, 1),
            },
            per_sample < 1000,
            "< 1000 µs CPU",
        )
    finally:
        for process in busy:
            process.kill()
            process.wait()
        agent.stop(destroy=True)
        shutil.rmtree(state, ignore_errors=True)

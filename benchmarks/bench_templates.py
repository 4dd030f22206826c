"""Templates built from Debian packages (docs/templates.md): what ``serve``'s first start
pays for its default template, and what a built template costs a sandbox's start.

Needs root, bubblewrap and mmdebstrap (``make host-tools``) and the machine's Debian
mirror; otherwise a single ``skipped`` row says why. Cases:

- ``default template: fresh build``: ``Builder.build`` of ``serve``'s default spec into an
  empty store (mmdebstrap from the mirror, every package downloaded), with its size on
  disk (``size_mb``: MiB of allocated blocks, as ``du`` counts them), its file count and
  the Debian packages installed;
- ``default template: cached build``: the same build again, which finds it in the store
  (what every later ``serve`` start and ``template build`` of the same spec pays);
- ``cold start (base)`` / ``cold start (default)``: one agent (bubblewrap, no warm pool,
  no network) serving both the host root and the default template; claims of each in
  alternating rounds, so both see the same machine; each claim starts a sandbox while
  the caller waits and is released (not timed) before the next;
- ``cold start default/base``: the ratio of the two p50s.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks import Row, with_target
from benchmarks.timing import Timing
from sandboxctl.agentapi.models import ClaimRequest
from sandboxctl.core.templates import DEFAULT_TEMPLATE, HOST_ROOT, default_spec
from sandboxctl.sandboxd.agent import Agent, AgentSettings
from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime
from sandboxctl.sandboxd.runtime import RuntimeFailure
from sandboxctl.sandboxd.templates.build import Builder
from sandboxctl.sandboxd.templates.store import TemplateStore

NAME = "templates"
ROUNDS = 20  # cold claims of each template
# Host uids of their own, clear of the suite's blocks and of the sandboxd benchmark's.
UID_BASE = 3_500_000 + (os.getpid() % 10_000) * 10
COLD_RATIO_TARGET = 1.5  # a built root is bound like the host's: no slower to start


def run() -> Iterator[Row]:
    reason = _unavailable()
    if reason:
        yield _row("skipped", reason=reason)
        return
    work = Path(tempfile.mkdtemp(prefix="sandboxctl-bench-templates-", dir="/tmp"))
    work.chmod(0o711)
    try:
        store = work / "store"
        yield from _builds(store)
        yield from _cold_starts(store, work / "state")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _builds(store: Path) -> Iterator[Row]:
    builder = Builder(TemplateStore(store))
    fresh = builder.build(DEFAULT_TEMPLATE, default_spec())
    built = fresh.template.build
    files = sum(len(names) for _, _, names in os.walk(fresh.template.root))
    yield with_target(
        _row(
            "default template: fresh build",
            build_s=round(fresh.seconds, 1),
            size_mb=round(built.size_bytes / 2**20, 1),
            files=files,
            packages=_installed(fresh.template.root),
        ),
        not fresh.cached,
        "report (built from the mirror, nothing cached)",
    )
    again = builder.build(DEFAULT_TEMPLATE, default_spec())
    yield with_target(
        _row("default template: cached build", build_ms=round(again.seconds * 1000, 1)),
        again.cached,
        "found in the store",
    )


def _cold_starts(store: Path, state: Path) -> Iterator[Row]:
    state.mkdir(mode=0o711)
    settings = AgentSettings(
        node="bench",
        advertise_addr="127.0.0.1:1",
        state_dir=state,
        max_sandboxes=4,
        uid_base=UID_BASE,
        template_store=store,
    )
    agent = Agent(settings, BubblewrapRuntime())
    samples: dict[str, list[float]] = {HOST_ROOT: [], DEFAULT_TEMPLATE: []}
    try:
        for _ in range(ROUNDS):
            for template, times in samples.items():
                started = time.perf_counter_ns()
                record = agent.claim(ClaimRequest(template=template))
                times.append(time.perf_counter_ns() - started)
                agent.release(record.id)
    finally:
        agent.stop(destroy=True)
    timings = {name: Timing(tuple(sorted(times))) for name, times in samples.items()}
    for name, timing in timings.items():
        yield _row(f"cold start ({name})", **timing.figures("ms"))
    ratio = timings[DEFAULT_TEMPLATE].p50_ns / timings[HOST_ROOT].p50_ns
    yield with_target(
        _row(f"cold start {DEFAULT_TEMPLATE}/{HOST_ROOT}", ratio=round(ratio, 2)),
        ratio <= COLD_RATIO_TARGET,
        f"report; p50 ratio <= {COLD_RATIO_TARGET:g}",
    )


def _installed(root: Path) -> int:
    """Debian packages installed in a root (dpkg's status file)."""
    status = (root / "var/lib/dpkg/status").read_text()
    return sum(1 for line in status.splitlines() if line == "Status: install ok installed")


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (mmdebstrap, sandbox uids)"
    try:
        BubblewrapRuntime.check()
    except RuntimeFailure as error:
        return str(error)
    if shutil.which("mmdebstrap") is None:
        return "needs mmdebstrap: make host-tools"
    return None


def _row(case: str, **figures: object) -> Row:
    return {"benchmark": NAME, "case": case, **figures}

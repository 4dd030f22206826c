"""What each claimed sandbox uses, sampled every few seconds into a bounded ring.

A sampler thread reads, for every claimed sandbox: its CPU time and memory from its
cgroups (cpuacct and memory; in rlimit mode, from the processes of its uid), and the
disk its home takes (the home's own tmpfs, read through the sandbox's root; or a home
directory on the host, walked). Each sandbox keeps its last ``ring`` samples, so memory
stays bounded however long it lives; a sandbox that is gone is forgotten at the next
pass. A claim asks for a pass at once (``poke``), so a new sandbox has a sample within
moments. The sampler counts its own CPU time, so its cost per sample is measured, not
guessed (``cost``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Protocol, runtime_checkable

from sandboxctl.agentapi.models import UsageSample
from sandboxctl.envd.host import SANDBOX_HOME
from sandboxctl.lifecycle import Loop, Stop
from sandboxctl.sandboxd import procfs
from sandboxctl.sandboxd.cgroups import CgroupUsage
from sandboxctl.sandboxd.runtime import Identity, Runtime, RuntimeFailure, SandboxSpec

log = logging.getLogger("sandboxctl.sandboxd")

DEFAULT_INTERVAL = 5.0
DEFAULT_RING = 720  # an hour at the default interval
MAX_WALK_ENTRIES = 200_000  # a home with more files is counted up to here
_TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class SamplerCost:
    """The sampler's own CPU time over every sample it took."""

    samples: int
    cpu_ns: int

    @property
    def cpu_us_per_sample(self) -> float:
        return self.cpu_ns / self.samples / 1000 if self.samples else 0.0


@runtime_checkable
class CountsUsage(Protocol):
    def usage(self, spec: SandboxSpec) -> CgroupUsage | None: ...


class UsageSampler:
    """Thread-safe. ``targets`` lists the claimed sandboxes to sample now; ``runtime`` may
    count their cgroups (a runtime without ``usage``, or one answering None, is counted
    by uid); ``now`` stamps the samples (unix seconds). CPU use is measured over the
    monotonic time between two samples."""

    def __init__(
        self,
        targets: Callable[[], Sequence[tuple[SandboxSpec, Identity]]],
        runtime: Runtime,
        interval: float = DEFAULT_INTERVAL,
        ring: int = DEFAULT_RING,
        now: Callable[[], float] = time.time,
    ) -> None:
        self._targets = targets
        self._now = now
        self._runtime = runtime
        self._counter = runtime if isinstance(runtime, CountsUsage) else None
        self.interval = interval
        self._ring = ring
        self._lock = threading.Lock()
        self._rings: dict[str, deque[UsageSample]] = {}
        self._cpu: dict[str, tuple[int, int]] = {}  # id -> (monotonic ns, cpu ns) last seen
        self._samples = 0
        self._cpu_ns = 0
        self._loop = Loop(
            "usage sampler", self.sample_once, timedelta(seconds=interval), logger=log
        )

    # --- reads -------------------------------------------------------------------------

    def samples(
        self, sandbox_id: str, start: float | None = None, end: float | None = None
    ) -> list[UsageSample]:
        """The sandbox's samples with ``start <= timestamp <= end``, oldest first."""
        with self._lock:
            ring = list(self._rings.get(sandbox_id, ()))
        return [
            s
            for s in ring
            if (start is None or s.timestamp >= start) and (end is None or s.timestamp <= end)
        ]

    def latest(self) -> Mapping[str, UsageSample]:
        """Every sampled sandbox's newest sample."""
        with self._lock:
            return {sandbox_id: ring[-1] for sandbox_id, ring in self._rings.items() if ring}

    @property
    def cost(self) -> SamplerCost:
        with self._lock:
            return SamplerCost(self._samples, self._cpu_ns)

    # --- sampling ----------------------------------------------------------------------

    def poke(self) -> None:
        """Sample soon (a sandbox was just claimed)."""
        self._loop.wake()

    def run(self, stopping: Stop) -> None:
        """Sample at once, then every interval and when poked, until ``stopping``."""
        self._loop.run(stopping)

    def sample_once(self) -> int:
        """Sample every target once; forget the sandboxes that are gone. Returns how many
        were sampled."""
        began = time.thread_time_ns()
        targets = list(self._targets())
        taken: dict[str, UsageSample] = {}
        for spec, identity in targets:
            try:
                taken[spec.id] = self._sample(spec, identity)
            except (OSError, RuntimeFailure) as error:  # gone since it was listed
                log.debug("no usage sample of %s: %s", spec.id, error)
        cost = time.thread_time_ns() - began
        with self._lock:
            live = {spec.id for spec, _ in targets}
            for gone in set(self._rings) - live:
                del self._rings[gone]
                self._cpu.pop(gone, None)
            for sandbox_id, sample in taken.items():
                ring = self._rings.setdefault(sandbox_id, deque(maxlen=self._ring))
                ring.append(sample)
            self._samples += len(taken)
            self._cpu_ns += cost if taken else 0
        return len(taken)

    def _sample(self, spec: SandboxSpec, identity: Identity) -> UsageSample:
        counted = self._counter.usage(spec) if self._counter is not None else None
        if counted is None:
            counted = uid_usage(spec.uid)
        now_ns = time.monotonic_ns()
        cpu_pct = 0.0
        if counted.cpu_ns is not None:
            with self._lock:
                before = self._cpu.get(spec.id)
                self._cpu[spec.id] = (now_ns, counted.cpu_ns)
            if before is not None and now_ns > before[0]:
                busy = max(0, counted.cpu_ns - before[1])
                cpu_pct = 100.0 * busy / ((now_ns - before[0]) * spec.limits.cpu_count)
        disk_used, disk_total = self._disk(spec, identity)
        return UsageSample(
            timestamp=self._now(),
            cpu_count=spec.limits.cpu_count,
            cpu_used_pct=round(min(cpu_pct, 100.0), 2),
            mem_used=counted.memory_bytes,
            mem_total=spec.limits.memory_bytes,
            mem_cache=counted.cache_bytes,
            disk_used=disk_used,
            disk_total=disk_total,
        )

    def _disk(self, spec: SandboxSpec, identity: Identity) -> tuple[int, int]:
        """(used, total) bytes of the sandbox's home."""
        if spec.home.is_dir():  # a host directory bound in: walk it
            host = os.statvfs(spec.home)
            return walked_size(spec.home), host.f_blocks * host.f_frsize
        # A tmpfs of its own: its counters are the home's (statvfs reads no file in it).
        home = os.statvfs(self._runtime.host_path(spec, identity, SANDBOX_HOME))
        return (home.f_blocks - home.f_bfree) * home.f_frsize, home.f_blocks * home.f_frsize


def uid_usage(uid: int) -> CgroupUsage:
    """CPU time and resident memory of every process of ``uid`` (no cgroups to ask). The
    CPU time of processes that already ended is not counted."""
    cpu_ticks = 0
    resident = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for pid in procfs.pids_of_uid(uid):
        try:
            stat = (procfs.PROC / str(pid) / "stat").read_bytes()
            statm = (procfs.PROC / str(pid) / "statm").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        cpu_ticks += int(fields[11]) + int(fields[12])  # utime, stime
        resident += int(statm[1]) * page
    return CgroupUsage(cpu_ticks * _TICK_NS, resident, 0)


def walked_size(home: Path) -> int:
    """Bytes the files under ``home`` take on disk (hard links once; symlinks are not
    followed); at most MAX_WALK_ENTRIES entries are counted."""
    seen: set[tuple[int, int]] = set()
    total = 0
    pending = [str(home)]
    entries = 0
    while pending and entries < MAX_WALK_ENTRIES:
        try:
            scan = os.scandir(pending.pop())
        except OSError:
            continue
        with scan:
            for entry in scan:
                entries += 1
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
    return total

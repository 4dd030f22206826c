"""Repeated timing with ``perf_counter_ns``: p50, p99 and min of per-operation times."""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

_NS_PER = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


@dataclass(frozen=True, slots=True)
class Timing:
    """Per-operation times of each timed run, in nanoseconds, sorted."""

    samples_ns: tuple[float, ...]

    def percentile(self, q: float) -> float:
        """Nearest-rank percentile (``q`` in 0..100) in nanoseconds."""
        at = max(0, math.ceil(q / 100 * len(self.samples_ns)) - 1)
        return self.samples_ns[at]

    @property
    def p50_ns(self) -> float:
        return self.percentile(50)

    def figures(self, unit: str, *, p99: bool = True, minimum: bool = True) -> dict[str, float]:
        """``{"p50_<unit>": .., "p99_<unit>": .., "min_<unit>": .., "runs": n}``."""
        scale = _NS_PER[unit]
        out: dict[str, float] = {f"p50_{unit}": _round(self.percentile(50) / scale)}
        if p99:
            out[f"p99_{unit}"] = _round(self.percentile(99) / scale)
        if minimum:
            out[f"min_{unit}"] = _round(self.samples_ns[0] / scale)
        out["runs"] = len(self.samples_ns)
        return out


def measure(
    fn: Callable[[], object],
    *,
    runs: int,
    ops: int = 1,
    warmup: int = 1,
    max_seconds: float | None = None,
    min_runs: int = 5,
) -> Timing:
    """Time ``fn`` ``runs`` times; each call performs ``ops`` operations.

    ``gc.collect()`` runs once before the measured block (collector left enabled, as in
    production). With ``max_seconds`` the block stops early once it has spent that long
    and has at least ``min_runs`` runs, so a loaded machine does not blow the time budget.
    """
    for _ in range(warmup):
        fn()
    gc.collect()
    deadline = None if max_seconds is None else time.perf_counter_ns() + max_seconds * 1e9
    clock = time.perf_counter_ns
    samples: list[float] = []
    for i in range(runs):
        start = clock()
        fn()
        end = clock()
        samples.append((end - start) / ops)
        if deadline is not None and i + 1 >= min_runs and end > deadline:
            break
    samples.sort()
    return Timing(tuple(samples))


def _round(value: float) -> float:
    """Four significant digits: figures are for reading, not for arithmetic."""
    if value == 0:
        return 0.0
    return round(value, max(0, 3 - math.floor(math.log10(abs(value)))))


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """For setup only: building a large fleet with the collector on mostly measures it."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
    gc.collect()

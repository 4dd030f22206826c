"""Warm pools: sandboxes started before anyone claims them, per pool key.

Each pool key has a target; the refill loop starts what the pools lack, one sandbox at a
time, furthest-behind pool first, while the node has room, and drains what exceeds them.
A claim takes the oldest warm sandbox of its key, or gives up a warm sandbox of another
pool to make room for a cold start.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from sandboxctl.agentapi.models import PoolStatus
from sandboxctl.core.model import DEFAULT_NET, NETS, PoolKey
from sandboxctl.lifecycle import Stop
from sandboxctl.sandboxd.errors import BadRequest, UnknownTemplate
from sandboxctl.sandboxd.runtime import Size
from sandboxctl.sandboxd.templates.catalog import Catalog

log = logging.getLogger("sandboxctl.sandboxd")

REFILL_RETRY_SECONDS = 1.0


class WarmPools:
    """Which warm sandboxes each pool has, how many it wants and how many are starting.
    Not thread-safe: the agent calls it under its lock (``wanted`` and ``run`` aside)."""

    def __init__(self, refill_once: Callable[[], int]) -> None:
        self._refill_once = refill_once  # starts what the pools lack; raises when a start fails
        self._targets: dict[PoolKey, int] = {}
        self._warm: dict[PoolKey, list[str]] = {}
        self._starting: dict[PoolKey, int] = {}
        self.wanted = threading.Event()  # set: something may need a refill

    def set_targets(self, targets: Mapping[PoolKey, int]) -> None:
        self._targets = {k: n for k, n in targets.items() if n > 0}

    def warm(self, key: PoolKey) -> list[str]:
        """The warm sandboxes of ``key``, oldest first."""
        return list(self._warm.get(key, ()))

    def add(self, key: PoolKey, sandbox_id: str) -> None:
        self._warm.setdefault(key, []).append(sandbox_id)

    def discard(self, key: PoolKey, sandbox_id: str) -> None:
        ids = self._warm.get(key, [])
        if sandbox_id in ids:
            ids.remove(sandbox_id)

    def pop_oldest(self, key: PoolKey) -> str | None:
        ids = self._warm.get(key, [])
        return ids.pop(0) if ids else None

    def pop_any(self) -> str | None:
        """The newest warm sandbox of the first pool that has one (to give up for room)."""
        for ids in self._warm.values():
            if ids:
                return ids.pop()
        return None

    def pop_excess(self) -> list[str]:
        """Take out the warm sandboxes beyond each pool's target (adopted ones included)."""
        drain: list[str] = []
        for key, ids in self._warm.items():
            excess = len(ids) - self._targets.get(key, 0)
            for _ in range(max(0, excess)):
                drain.append(ids.pop())
        return drain

    def begin_start(self, key: PoolKey) -> None:
        self._starting[key] = self._starting.get(key, 0) + 1

    def end_start(self, key: PoolKey) -> None:
        self._starting[key] -= 1

    def starting(self) -> int:
        return sum(self._starting.values())

    def next_refill(self) -> PoolKey | None:
        """The pool furthest below its target, if any (the caller checks for room)."""
        lacking = [
            (len(self._warm.get(k, ())) + self._starting.get(k, 0) - target, k)
            for k, target in self._targets.items()
        ]
        lacking = [item for item in lacking if item[0] < 0]
        return min(lacking)[1] if lacking else None

    def status(self) -> tuple[PoolStatus, ...]:
        keys = sorted(set(self._targets) | {k for k, ids in self._warm.items() if ids})
        return tuple(
            PoolStatus(
                key=key,
                warm=len(self._warm.get(key, ())),
                target=self._targets.get(key, 0),
                refilling=self._starting.get(key, 0),
            )
            for key in keys
        )

    def run(self, stopping: Stop) -> None:
        """The refill loop: refill whenever ``wanted``, until ``stopping`` (which sets
        ``wanted``, to end the wait: a refill has no interval)."""
        stopping.on_set(self.wanted.set)
        while not stopping.is_set():
            self.wanted.wait()
            self.wanted.clear()
            try:
                self._refill_once()
            except Exception:
                # Already logged; try again later instead of spinning on a broken start.
                stopping.wait(REFILL_RETRY_SECONDS)
                self.wanted.set()


def check_pool_key(key: PoolKey, templates: Catalog) -> None:
    if key.template not in templates:
        raise UnknownTemplate(f"template {key.template!r} is not served by this node")
    if key.net not in NETS:
        raise BadRequest(f"net: must be one of {', '.join(NETS)}")
    if key.size not in {s.value for s in Size}:
        raise BadRequest(f"size: must be one of {', '.join(s.value for s in Size)}")


def check_targets(targets: Mapping[PoolKey, int], templates: Catalog) -> None:
    for key, target in targets.items():
        check_pool_key(key, templates)
        if key.net != DEFAULT_NET:
            raise BadRequest(
                f"pools: {key}: net is not a pool dimension: every warm sandbox serves "
                "either net (the claim applies it); drop it"
            )
        if target < 0:
            raise BadRequest(f"pools: warm for {key} must not be negative")

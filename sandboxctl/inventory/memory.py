"""An in-memory source that doubles as the applier: the stand-in fault tests drive."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from sandboxctl.clock import Clock, SystemClock
from sandboxctl.core.model import NodeInventory
from sandboxctl.core.snapshot import FleetSnapshot


class MemoryInventorySource:
    """Holds inventories applied to it; ``apply_count`` lets a test prove a write happened."""

    def __init__(self, inventories: Iterable[NodeInventory] = (), clock: Clock | None = None):
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._snapshot = FleetSnapshot.build(inventories, self._clock.monotonic())
        self.apply_count = 0

    def snapshot(self) -> FleetSnapshot:
        return self._snapshot

    def apply(self, inventory: NodeInventory) -> None:
        with self._lock:
            self._snapshot = self._snapshot.replace(inventory, self._clock.monotonic())
            self.apply_count += 1

    def remove(self, node: str) -> None:
        with self._lock:
            self._snapshot = self._snapshot.remove(node, self._clock.monotonic())

"""An in-memory source that doubles as the applier: the stand-in fault tests drive."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from sandboxctl.clock import Clock, SystemClock
from sandboxctl.core.model import NodeInventory
from sandboxctl.core.snapshot import FleetSnapshot
from sandboxctl.inventory.source import Listener, Subscribers


class MemoryInventorySource:
    """Holds inventories applied to it; ``apply_count`` lets a test prove a write happened."""

    def __init__(self, inventories: Iterable[NodeInventory] = (), clock: Clock | None = None):
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._snapshot = FleetSnapshot.build(inventories, self._clock.monotonic())
        self._subscribers = Subscribers()
        self.apply_count = 0

    def snapshot(self) -> FleetSnapshot:
        return self._snapshot

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        return self._subscribers.subscribe(listener)

    def apply(self, inventory: NodeInventory) -> None:
        with self._lock:
            self._snapshot = self._snapshot.replace(inventory, self._clock.monotonic())
            self.apply_count += 1
        self._subscribers.notify()

    def remove(self, node: str) -> None:
        with self._lock:
            self._snapshot = self._snapshot.remove(node, self._clock.monotonic())
        self._subscribers.notify()

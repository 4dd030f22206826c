"""The fleet reads' syncs against the source's swaps: never back to an older snapshot."""

from __future__ import annotations

import threading
from collections.abc import Callable

from sandboxctl.clock import ManualClock
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.snapshot import FleetSnapshot
from sandboxctl.core.watching import ADDED, DELETED
from sandboxctl.inventory.memory import MemoryInventorySource
from sandboxctl.store.reads import FleetReads
from tests.store.inventories import T0, entry, node


class _SwapDuringRead:
    """A source that, when armed, swaps in ``after`` (notifying) while a reader is in
    ``snapshot()``, and hands that reader the snapshot it had before the swap: a reader
    that read just before the source's thread swapped and synced."""

    def __init__(self, inner: MemoryInventorySource) -> None:
        self.inner = inner
        self.armed: Callable[[], None] | None = None
        self.threads: list[threading.Thread] = []
        self.reads: FleetReads | None = None

    def snapshot(self) -> FleetSnapshot:
        swap, self.armed = self.armed, None
        before = self.inner.snapshot()
        if swap is not None:
            assert self.reads is not None
            if self.reads._sync_lock.locked():  # the reader holds it: the swap syncs after
                thread = threading.Thread(target=swap)
                thread.start()
                self.threads.append(thread)
            else:  # the lock is free: the source's thread syncs first, to the end
                swap()
        return before

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        return self.inner.subscribe(listener)


def test_a_read_holding_an_older_snapshot_never_rebuilds_from_it() -> None:
    clock = ManualClock(T0)
    inner = MemoryInventorySource([node("a")], clock=clock)
    source = _SwapDuringRead(inner)
    reads = FleetReads(source, FreshnessRule(), clock=clock)
    source.reads = reads
    start = reads.state().version  # the ledger is built: notifications log changes
    source.armed = lambda: inner.apply(node("a", entry("default/x")))

    reads.sync()  # a request thread's read (a watch's poll), racing the swap
    for thread in source.threads:
        thread.join()
    changes = reads.changes_since(start)

    assert [(c.type, c.name) for c in changes] == [(ADDED, ("default", "x"))]
    assert DELETED not in {c.type for c in changes}
    reads.close()

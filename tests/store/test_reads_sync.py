"""The fleet reads' syncs against the source's swaps: never back to an older snapshot."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from sandboxctl.clock import ManualClock
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.ids import SandboxId
from sandboxctl.core.snapshot import FleetSnapshot
from sandboxctl.core.watching import ADDED, DELETED
from sandboxctl.inventory.memory import MemoryInventorySource
from sandboxctl.store import SandboxStore
from sandboxctl.store.owners import Owner
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

    def swap() -> None:  # another thread's read syncs the new snapshot at once
        inner.apply(node("a", entry("default/x")))
        reads.sync()

    source.armed = swap

    reads.sync()  # a request thread's read (a watch's poll), racing the swap
    for thread in source.threads:
        thread.join()
    changes = reads.changes_since(start)

    assert [(c.type, c.name) for c in changes] == [(ADDED, ("default", "x"))]
    assert DELETED not in {c.type for c in changes}
    reads.close()


def _until(done: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _syncers(reads: FleetReads) -> list[threading.Thread]:
    name = f"fleet-reads-sync-{id(reads):x}"
    return [t for t in threading.enumerate() if t.name == name]


def test_a_notification_syncs_on_the_syncer_thread_not_the_sources() -> None:
    clock = ManualClock(T0)
    source = MemoryInventorySource([node("a")], clock=clock)
    reads = FleetReads(source, FreshnessRule(), clock=clock)
    start = reads.state().version
    synced_on: list[threading.Thread] = []
    reads.subscribe(lambda: synced_on.append(threading.current_thread()))

    source.apply(node("a", entry("default/x")))  # on this thread: the source's

    _until(lambda: bool(synced_on), "the change to be logged")
    assert synced_on == _syncers(reads)
    assert [(c.type, c.name) for c in reads.changes_since(start)] == [(ADDED, ("default", "x"))]
    reads.close()
    assert _syncers(reads) == []


def test_a_burst_of_notifications_costs_one_sync() -> None:
    clock = ManualClock(T0)
    source = MemoryInventorySource([node(f"n{i}") for i in range(20)], clock=clock)
    reads = FleetReads(source, FreshnessRule(), clock=clock)
    start = reads.state().version
    entered, release = threading.Event(), threading.Event()
    syncs: list[int] = []

    def listener() -> None:  # holds the syncer in its first sync
        syncs.append(1)
        entered.set()
        assert release.wait(5)

    reads.subscribe(listener)
    source.apply(node("n0", entry("default/first")))
    assert entered.wait(5)
    for i in range(20):  # a poll round: one swap, one notification per node
        source.apply(node(f"n{i}", entry(f"default/s{i}")))
    release.set()

    _until(lambda: len(syncs) == 2, "the burst's sync")
    names = {c.name for c in reads.changes_since(start)}
    assert {("default", f"s{i}") for i in range(20)} <= names
    reads.close()
    assert len(syncs) == 2


def test_close_stops_the_syncer_and_later_notifications_start_none() -> None:
    clock = ManualClock(T0)
    source = MemoryInventorySource([node("a")], clock=clock)
    reads = FleetReads(source, FreshnessRule(), clock=clock)
    reads.state()
    source.apply(node("a", entry("default/x")))
    reads.close()
    assert _syncers(reads) == []
    source.apply(node("a", entry("default/y")))
    assert _syncers(reads) == []


def test_the_cached_owner_never_waits_on_a_sync() -> None:
    clock = ManualClock(T0)
    source = MemoryInventorySource([node("a", entry("default/x"))], clock=clock)
    store = SandboxStore(source, FreshnessRule(), clock=clock)
    sandbox_id = SandboxId.of_claim("sb_default_x")
    owner = Owner("a", "a.fleet.test:7777", "sb_default_x", token="t", listed=True)
    store.resolver.owners.remember(owner, sandbox_id)
    assert store.cached_owner(sandbox_id) == owner
    found: list[Owner | None] = []

    with store.reads._sync_lock:  # a sync under way (a rebuild, on another thread)
        source.apply(node("a", entry("default/x"), entry("default/y")))
        thread = threading.Thread(target=lambda: found.append(store.cached_owner(sandbox_id)))
        thread.start()
        thread.join(5)
        assert found == [owner]
    store.close()

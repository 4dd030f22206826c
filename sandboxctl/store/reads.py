"""Fleet reads: what this server reads of the fleet, for every API that serves it.

Reads come from the source's snapshot under the freshness rule, so a stale node is
invisible to every read. Over that snapshot this server lays its own writes the
inventories do not show yet (``overlay``), and keeps every sandbox as one Kubernetes
object with a resourceVersion and a log of changes (``ledger``): lists, pages and watches
read those, so a write through this server is visible to its next read of any kind.

A read is brought up to date when it is made, and soon after the source swaps in a new
snapshot (the source notifies): so the ledger logs an inventory change, and wakes the
watches, without anyone polling for it. A notification only wakes this object's syncer
thread, which runs one sync for every burst of them: a source notifies once per polled
node or informer event, and a rebuild per notification on the source's thread made a
poll round of N nodes cost N rebuilds. What no notification announces is time: a node
going stale shows at the next read (a watch's tick reads).

The owners this server remembers (``owners``) are kept here, since an inventory change
is what makes one wrong.
"""

from __future__ import annotations

import builtins
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import msgspec

from sandboxctl.clock import Clock, SystemClock
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.model import Entry, PoolKey
from sandboxctl.core.placement import serves
from sandboxctl.core.sandboxes import sandbox_object
from sandboxctl.core.snapshot import FleetView, Located, NodeRecord, WarmCandidate
from sandboxctl.inventory.source import InventorySource
from sandboxctl.store.ledger import DEFAULT_RETAIN, Change, Ledger, State
from sandboxctl.store.lists import ListPage, ListStates
from sandboxctl.store.overlay import PendingWrites
from sandboxctl.store.owners import Owners
from sandboxctl.store.pages import KeyOf, SortedIndex
from sandboxctl.store.query import Query
from sandboxctl.store.watch import Watch

log = logging.getLogger("sandboxctl.store")

SYNCER_IDLE = 30.0  # seconds without a notification before the syncer thread ends


@dataclass(slots=True)
class ReadStats:
    """What reads cost, for tests and benchmarks: live requests per node address, and
    node records the ledger read (rescans)."""

    live_asks: dict[str, int] = field(default_factory=dict)
    rescans: int = 0

    def asked(self, address: str) -> None:
        self.live_asks[address] = self.live_asks.get(address, 0) + 1


@dataclass(frozen=True, slots=True)
class Read:
    """What this server reads at one sync: the view, and each fresh node's record with
    its pending writes applied, in node-name order; ``inventories``: each fresh node's
    record as its inventory publishes it (no pending write applied)."""

    view: FleetView
    records: tuple[tuple[str, NodeRecord], ...]
    by_node: Mapping[str, NodeRecord]
    inventories: Mapping[str, NodeRecord]


class FleetReads:
    """One per process. Thread-safe."""

    def __init__(
        self,
        source: InventorySource,
        rule: FreshnessRule,
        *,
        clock: Clock | None = None,
        retain: int = DEFAULT_RETAIN,
        write_bound: timedelta | None = None,
        first_version: int | None = None,
    ) -> None:
        self._source = source
        self._rule = rule
        self._clock = clock or SystemClock()
        bound = write_bound or rule.stale_after
        # A claim no inventory lists within the write bound is one its node no longer holds.
        self.owners = Owners(clock=self._clock.monotonic, unlisted_for=bound.total_seconds())
        self._stats = ReadStats()
        self._ledger = Ledger(retain, first_version)
        self._writes = PendingWrites(bound)
        self._lists = ListStates(self._clock.monotonic)
        self._pages: dict[KeyOf, SortedIndex] = {}
        self._sync_lock = threading.Lock()
        self._read: tuple[tuple[object, ...], Read] | None = None
        self._syncer = _Syncer(self._sync_for_source, f"fleet-reads-sync-{id(self):x}")
        self._unsubscribe = source.subscribe(self._syncer.wake)

    def close(self) -> None:
        """Stop following the source (the source belongs to the caller), and end the
        syncer thread (after the sync it may be running)."""
        self._unsubscribe()
        self._syncer.close()

    @property
    def stats(self) -> ReadStats:
        self._stats.rescans = self._ledger.rescans
        return self._stats

    def now(self) -> datetime:
        return self._clock.now()

    # --- syncs ---------------------------------------------------------------------------

    def sync(self) -> Read:
        """What this server reads now, with the ledger brought up to it (the source's
        snapshot and this server's writes); cheap when neither changed since the last
        call."""
        return self.current(ledger=True)

    def current(self, ledger: bool = False) -> Read:
        """What this server reads now: the fresh nodes' records with its pending writes
        applied. The ledger (objects, versions, the change log) is brought up to it only
        for ``ledger``: the e2b API and the proxy never need the Kubernetes objects, so
        they never pay for building them."""
        with self._sync_lock:  # one at a time: the ledger must never go back to older inputs
            # The snapshot is taken under the lock: one taken before it could be older
            # than the one another thread synced meanwhile, and rebuilding from it would
            # log the sandboxes added since as deleted.
            snapshot = self._source.snapshot()
            view = snapshot.view(self._rule, self._clock.now(), self._clock.monotonic())
            if len(self._writes):
                self._writes.settle(snapshot.record, self._clock.monotonic())
            inputs = (snapshot, view.rule.cutoff(view.reference), self._writes.version)
            last = self._read
            if last is not None and _same(last[0], inputs):
                read = dataclasses.replace(last[1], view=view)
            else:
                inventories = {
                    node: record
                    for node in view.fresh_nodes()
                    if (record := snapshot.record(node)) is not None
                }
                records = tuple(
                    (node, self._writes.apply(node, record)) for node, record in inventories.items()
                )
                read = Read(view, records, dict(records), inventories)
                if last is not None and len(self.owners):
                    self.owners.nodes_changed(_changed(last[1].inventories, inventories))
                self._read = (inputs, read)
            if ledger:
                self._ledger.sync(inputs, lambda: read.records)
            return read

    def latest(self) -> Read:
        """The last read built, its view judged at the current time (a node gone stale
        since is not in it); never waits on a sync under way, so it may miss a change
        the source notified a moment ago. Builds one only when none was built yet."""
        last = self._read
        if last is None:
            return self.current()
        snapshot = last[1].view.snapshot
        view = snapshot.view(self._rule, self._clock.now(), self._clock.monotonic())
        return dataclasses.replace(last[1], view=view)

    def _sync_for_source(self) -> None:
        # On the syncer thread, after a burst of notifications: log the change (waking
        # the watches) if anything reads the ledger, and drop the owners it makes wrong.
        self.current(ledger=self._ledger.synced)

    # --- this server's writes ------------------------------------------------------------

    def wrote(self, node: str, claim_id: str, entry: Entry | None) -> None:
        """Record that ``node`` now holds ``entry`` under ``claim_id`` (None: released)."""
        record = self._source.snapshot().record(node)
        self._writes.wrote(node, claim_id, entry, record, self._clock.monotonic())
        if self._ledger.synced:  # log the change now, and wake the watches
            self.sync()

    def rewrote(self, located: Located, **changes: Any) -> None:
        """Record a change of a sandbox's entry on its node."""
        current = self.held_claim(located.entry.id) or located
        changed = msgspec.structs.replace(current.entry, **changes)
        self.wrote(located.node, located.entry.id, changed)

    # --- lookups of what this server reads ------------------------------------------------

    def held_claim(self, claim_id: str, read: Read | None = None) -> Located | None:
        """The claim as this server reads it: its pending write, else the inventories."""
        read = read or self.current()
        pending = self._writes.find(claim_id)
        if pending is not None:
            node, entry = pending
            if entry is None or node not in read.by_node:
                return None
            return Located(node, entry)
        return read.view.lookup_claim_id(claim_id)

    def held_name(self, namespace: str, name: str, read: Read | None = None) -> Located | None:
        """The first node holding a name, as the ledger reads it: the inventories'
        holders, and the nodes with pending writes (which may hold it only in this
        server's eyes)."""
        read = read or self.current()
        holders = {found.node for found in read.view.lookup_name(namespace, name)}
        for holder in sorted(holders | self._writes.nodes()):
            record = read.by_node.get(holder)
            entry = record.by_name.get((namespace, name)) if record is not None else None
            if entry is not None:
                return Located(holder, entry)
        return None

    def entries(self, read: Read | None = None) -> Iterator[Located]:
        """Every sandbox this server reads, node by node."""
        for node, record in (read or self.current()).records:
            for entry in record.inventory.entries:
                yield Located(node, entry)

    # --- the nodes and their templates ---------------------------------------------------

    def fresh_nodes(self) -> builtins.list[str]:
        return [node for node, _ in self.current().records]

    def address(self, node: str) -> str | None:
        """A fresh node's advertised address; None when it is stale, unknown or has none."""
        inventory = self.current().view.inventory(node)
        return inventory.address if inventory is not None and inventory.address else None

    def has_template(self, template: str) -> bool:
        """Whether a fresh node serves ``template`` (lists it, or has a pool of it)."""
        return any(serves(record.inventory, template) for _, record in self.current().records)

    def templates(self) -> builtins.list[str]:
        """Every template a fresh node serves (lists, or has a pool of), sorted."""
        records = self.current().records
        names = {
            str(t.get("template"))
            for _, record in records
            for t in record.inventory.templates
            if t.get("template")
        }
        names.update(pool.key.template for _, record in records for pool in record.inventory.pools)
        return sorted(names)

    def template_entries(self) -> dict[str, Mapping[str, Any]]:
        """Each template a fresh node lists, with what that node says of it (its build,
        for one built from Debian packages); where nodes differ, the newest build wins."""
        found: dict[str, Mapping[str, Any]] = {}
        for _, record in self.current().records:
            for entry in record.inventory.templates:
                name = str(entry.get("template") or "")
                if name and _newer_build(entry, found.get(name)):
                    found[name] = entry
        return found

    def warm_candidates(self, key: PoolKey) -> builtins.list[WarmCandidate]:
        return self.current().view.warm_candidates(key)

    # --- the ledger: lists, watches, objects ----------------------------------------------

    def state(self) -> State:
        """Every object at the ledger's current version."""
        self.sync()
        return self._ledger.state()

    def changes_since(self, version: int) -> builtins.list[Change]:
        self.sync()
        return self._ledger.since(version)

    def check_version(self, version: int) -> None:
        """Raise Expired unless a watch can resume from ``version``."""
        self.sync()
        self._ledger.check(version)

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` after each sync that logged a change (from that thread): an
        inventory change, or a write through this server."""
        return self._ledger.subscribe(listener)

    def retained_changes(self) -> int:
        return self._ledger.retained()

    def list(
        self, query: Query, limit: int | None = None, continue_token: str | None = None
    ) -> ListPage:
        """One page of the objects matching the query, sorted by (namespace, name), from
        one consistent state: the current one, or the one ``continue_token`` names."""
        current = self.state()
        if continue_token:
            state, after = self._lists.resume(continue_token, current)
        else:
            state, after = current, None
        return self._lists.page(state, query, after, limit)

    def watch(
        self,
        query: Query,
        resource_version: int | None = None,
        send_initial_events: bool = False,
    ) -> Watch:
        return Watch(self, query, resource_version, send_initial_events)

    def page(
        self,
        namespace: str,
        key: KeyOf,
        accepts: Callable[[Entry], bool],
        cursor: Any,
        descending: bool,
        limit: int | None,
    ) -> tuple[builtins.list[Located], Any, datetime]:
        """Sandboxes of a namespace ordered by ``key`` (a function of the entry kept for
        the store's life), after ``cursor``; the cursor of the next page (see ``pages``);
        and the time of the read. The e2b listing reads this."""
        read = self.current()
        with self._sync_lock:
            index = self._pages.setdefault(key, SortedIndex(key))
        found, following = index.page(read.records, namespace, accepts, cursor, descending, limit)
        return found, following, read.view.now

    def object_of(self, located: Located) -> dict[str, Any]:
        """The served object for a located sandbox: the ledger's when it holds that very
        entry, else one made now at the current version."""
        self.sync()
        state = self._ledger.state()
        held = state.held.get(located.entry.namespaced_name)
        if held is not None and held.located == located:
            return held.object
        return sandbox_object(located, str(state.version))


def _changed(
    before: Mapping[str, NodeRecord], after: Mapping[str, NodeRecord]
) -> Iterator[tuple[str, NodeRecord | None]]:
    """Each node whose record is not the one it was: with its new record, None if gone."""
    for node, record in before.items():
        now = after.get(node)
        if now is not record:
            yield node, now
    for node, record in after.items():
        if node not in before:
            yield node, record


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return all(x is y or x == y for x, y in zip(a, b, strict=True))


def _newer_build(entry: Mapping[str, Any], than: Mapping[str, Any] | None) -> bool:
    """A template entry with a build is newer than one without; else by ``createdAt``."""
    if than is None:
        return True
    return (bool(entry.get("digest")), str(entry.get("createdAt") or "")) > (
        bool(than.get("digest")),
        str(than.get("createdAt") or ""),
    )


class _Syncer:
    """One thread that runs ``sync`` after :meth:`wake`, once for however many wakes
    came while it was not yet running: a burst of notifications costs one sync, or two
    when it straddles one. The thread starts at the first wake, ends after
    ``SYNCER_IDLE`` seconds without one (the next wake starts another), and at
    :meth:`close`."""

    def __init__(self, sync: Callable[[], None], name: str) -> None:
        self._sync = sync
        self._name = name
        self._cond = threading.Condition()
        self._pending = False
        self._closed = False
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        """Mark the reads out of date; cheap, from any thread (the source's)."""
        with self._cond:
            if self._closed:
                return
            self._pending = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            else:
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            thread = self._thread
            self._cond.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while self._next():
            try:
                self._sync()
            except Exception:  # the next notification, or the next read, syncs again
                log.exception("a fleet reads sync after an inventory change failed")

    def _next(self) -> bool:
        """Wait for a wake; False when the thread is to end (closed, or idle)."""
        with self._cond:
            while not self._pending and not self._closed:
                if not self._cond.wait(SYNCER_IDLE) and not self._pending:
                    self._thread = None
                    return False
            if self._closed:
                self._thread = None
                return False
            self._pending = False
            return True

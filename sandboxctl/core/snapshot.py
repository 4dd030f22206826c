"""The fleet snapshot: an immutable, indexed view of every node's inventory.

Readers share one snapshot without copying it; a writer replaces one node at a time and
gets a new snapshot that shares everything else (the indexes are persistent hash maps), so
replacing a node costs that node's entries, never the fleet's.

Freshness is not baked in: :meth:`FleetSnapshot.view` applies a :class:`FreshnessRule` at
read time, so the same snapshot answers differently as the reader's clock moves.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import itertools
import operator
import threading
from collections.abc import Collection, Iterable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Generic, TypeVar

import immutables

from sandboxctl.core.freshness import FreshnessRule, NodeState, Reference
from sandboxctl.core.model import Entry, NodeInventory, PoolKey

K = TypeVar("K")


@dataclass(frozen=True, slots=True)
class Located:
    """An entry and the node that holds it."""

    node: str
    entry: Entry


@dataclass(frozen=True, slots=True)
class Stall:
    """A stretch longer than one publish interval in which this reader saw no new stamp.

    Nobody could publish (a control-plane write outage, or this reader cut off), so the
    time is not held against the nodes stamped before it: each of them is credited with
    ``excess``, the part of the stall beyond one publish interval.
    """

    before: datetime  # the newest stamp when the stall began
    excess: timedelta


MAX_STALLS = 16


@dataclass(frozen=True, slots=True)
class WarmCandidate:
    node: str
    address: str
    warm: int


class NodeRecord:
    """One node's inventory with its own indexes, built once when the node is replaced."""

    __slots__ = ("by_id", "by_name", "inventory", "unique", "warm")

    def __init__(self, inventory: NodeInventory) -> None:
        self.inventory = inventory
        by_name: dict[tuple[str, str], Entry] = {}
        by_id: dict[str, Entry] = {}
        with_id = 0
        for entry in inventory.entries:
            # A name claimed twice on one node: the first in publish order answers.
            by_name.setdefault(entry.namespaced_name, entry)
            if entry.id:
                with_id += 1
                by_id.setdefault(entry.id, entry)
        self.by_name = by_name
        self.by_id = by_id
        # No name and no claim id held twice: every entry has its own slot in both maps.
        self.unique = len(by_name) == len(inventory.entries) and len(by_id) == with_id
        self.warm = _warm_of(inventory)

    @property
    def stamp(self) -> datetime | None:
        return self.inventory.published_at

    def revised(self, inventory: NodeInventory) -> tuple[NodeRecord, KeyChanges]:
        """The node's next record, and the names and claim ids it gained and lost.

        Entries the new inventory shares with this one (the same objects: a source that
        reuses what did not change hands them over) keep their slots, so the cost follows
        what changed, not the node's size. A name or id held twice builds afresh, and so
        does a publish mostly new (patching costs about twice what building does per entry)."""
        if self.unique:
            gone, added = _unshared(self.inventory.entries, inventory.entries)
            revised = (
                self._patched(inventory, gone, added)
                if 2 * len(added) <= len(inventory.entries)
                else None
            )
            if revised is not None:
                return revised
        record = NodeRecord(inventory)
        return record, KeyChanges(
            self.by_name.keys() - record.by_name.keys(),
            record.by_name.keys() - self.by_name.keys(),
            self.by_id.keys() - record.by_id.keys(),
            record.by_id.keys() - self.by_id.keys(),
        )

    def _patched(
        self, inventory: NodeInventory, gone: list[Entry], added: list[Entry]
    ) -> tuple[NodeRecord, KeyChanges] | None:
        """This record with ``gone`` taken out and ``added`` put in; None when an added
        entry's name or id is already held (the caller builds afresh)."""
        by_name, by_id = dict(self.by_name), dict(self.by_id)
        names_gone, ids_gone = set(), set()
        for entry in gone:
            name = entry.namespaced_name
            del by_name[name]
            names_gone.add(name)
            if entry.id:
                del by_id[entry.id]
                ids_gone.add(entry.id)
        names_added, ids_added = set(), set()
        for entry in added:
            name = entry.namespaced_name
            if name in by_name:
                return None
            by_name[name] = entry
            names_added.add(name)
            if entry.id:
                if entry.id in by_id:
                    return None
                by_id[entry.id] = entry
                ids_added.add(entry.id)
        if len(by_name) != len(inventory.entries):
            return None  # one entry object listed twice
        record = NodeRecord.__new__(NodeRecord)
        record.inventory = inventory
        record.by_name = by_name
        record.by_id = by_id
        record.unique = True
        record.warm = _warm_of(inventory)
        # A name both gone and added (an entry that changed) stays in the fleet's indexes.
        return record, KeyChanges(
            names_gone - names_added,
            names_added - names_gone,
            ids_gone - ids_added,
            ids_added - ids_gone,
        )


def _unshared(old: tuple[Entry, ...], new: tuple[Entry, ...]) -> tuple[list[Entry], list[Entry]]:
    """The entries only ``old`` holds and those only ``new`` holds, by identity. Those in
    the same place in both are passed over all at once; only the others are matched up."""
    common = min(len(old), len(new))
    moved = list(itertools.compress(range(common), map(operator.is_not, old, new)))
    before = {id(e): e for e in [*map(old.__getitem__, moved), *old[common:]]}
    after = {id(e): e for e in [*map(new.__getitem__, moved), *new[common:]]}
    return (
        [before[k] for k in before.keys() - after.keys()],
        [after[k] for k in after.keys() - before.keys()],
    )


def _warm_of(inventory: NodeInventory) -> dict[PoolKey, int]:
    warm: dict[PoolKey, int] = {}
    if inventory.address:
        for pool in inventory.pools:
            if pool.warm > 0:
                warm[pool.key] = warm.get(pool.key, 0) + pool.warm
    return warm


@dataclass(frozen=True, slots=True)
class KeyChanges:
    """The names and claim ids one node gained and lost in a replace."""

    names_gone: AbstractSet[tuple[str, str]]
    names_added: AbstractSet[tuple[str, str]]
    ids_gone: AbstractSet[str]
    ids_added: AbstractSet[str]


class _NodeSetIndex(Generic[K]):
    """Key -> sorted tuple of nodes, kept in a persistent map."""

    @staticmethod
    def update(
        index: immutables.Map[K, tuple[str, ...]],
        node: str,
        gone: Collection[K],
        added: Collection[K],
    ) -> immutables.Map[K, tuple[str, ...]]:
        """``node`` taken out of the keys in ``gone`` and put in those in ``added`` (the
        two do not overlap)."""
        if not gone and not added:
            return index
        mutation = index.mutate()
        alone = (node,)  # one tuple for every key only this node holds
        for key in gone:
            nodes = mutation.pop(key, ())  # mostly held by this node alone: one lookup
            if nodes != alone and (kept := tuple(n for n in nodes if n != node)):
                mutation[key] = kept
        for key in added:
            nodes = mutation.get(key, ())
            if not nodes:
                mutation[key] = alone
            elif node not in nodes:
                at = bisect.bisect(nodes, node)
                mutation[key] = (*nodes[:at], node, *nodes[at:])
        return mutation.finish()


class FleetSnapshot:
    """Every node's inventory and the fleet-wide indexes; never changes once built."""

    __slots__ = (
        "_by_id",
        "_by_name",
        "_nodes",
        "_records",
        "_warm",
        "newest",
        "newest_seen_at",
        "stall_after",
        "stalls",
    )

    def __init__(
        self,
        records: immutables.Map[str, NodeRecord],
        nodes: tuple[str, ...],
        by_name: immutables.Map[tuple[str, str], tuple[str, ...]],
        by_id: immutables.Map[str, tuple[str, ...]],
        warm: immutables.Map[PoolKey, tuple[WarmCandidate, ...]],
        newest: datetime | None,
        newest_seen_at: float | None,
        stall_after: timedelta | None,
        stalls: tuple[Stall, ...],
    ) -> None:
        self._records = records
        self._nodes = nodes
        self._by_name = by_name
        self._by_id = by_id
        self._warm = warm
        self.newest = newest
        self.newest_seen_at = newest_seen_at
        self.stall_after = stall_after
        self.stalls = stalls

    # --- building ----------------------------------------------------------------------

    @classmethod
    def empty(cls, stall_after: timedelta | None = None) -> FleetSnapshot:
        """An empty fleet. ``stall_after`` (the publish interval) turns on stall credit:
        a stretch longer than it in which no new stamp arrives is not held against the
        nodes stamped before it. None keeps the bare rule."""
        return cls(
            immutables.Map(),
            (),
            immutables.Map(),
            immutables.Map(),
            immutables.Map(),
            None,
            None,
            stall_after,
            (),
        )

    @classmethod
    def build(
        cls,
        inventories: Iterable[NodeInventory],
        seen_at: float | None = None,
        stall_after: timedelta | None = None,
    ) -> FleetSnapshot:
        """The fleet in one pass: the same snapshot as replacing each inventory in turn
        (a later inventory of the same node wins), built without the per-node copies."""
        with collector_paused():
            return cls._build(inventories, seen_at, stall_after)

    @classmethod
    def _build(
        cls,
        inventories: Iterable[NodeInventory],
        seen_at: float | None,
        stall_after: timedelta | None,
    ) -> FleetSnapshot:
        records = {inventory.node: NodeRecord(inventory) for inventory in inventories}
        nodes = tuple(sorted(records))
        by_name: dict[tuple[str, str], list[str]] = {}
        by_id: dict[str, list[str]] = {}
        warm: dict[PoolKey, list[WarmCandidate]] = {}
        for node in nodes:  # in name order, so every list below comes out sorted
            record = records[node]
            for name_key in record.by_name:
                by_name.setdefault(name_key, []).append(node)
            for claim_id in record.by_id:
                by_id.setdefault(claim_id, []).append(node)
            for pool_key, count in record.warm.items():
                candidate = WarmCandidate(node, record.inventory.address, count)
                warm.setdefault(pool_key, []).append(candidate)
        stamps = [r.stamp for r in records.values() if r.stamp is not None]
        newest = max(stamps) if stamps else None
        return cls(
            immutables.Map(records),
            nodes,
            immutables.Map({k: tuple(v) for k, v in by_name.items()}),
            immutables.Map({k: tuple(v) for k, v in by_id.items()}),
            immutables.Map({k: tuple(v) for k, v in warm.items()}),
            newest,
            seen_at if newest is not None else None,
            stall_after,
            (),
        )

    def replace(self, inventory: NodeInventory, seen_at: float | None = None) -> FleetSnapshot:
        """A new snapshot with this node's inventory put in place of its old one.

        ``seen_at`` is the reader's monotonic time of this update; it dates a new newest
        stamp for the extrapolating reference.
        """
        node = inventory.node
        old = self._records.get(node)
        nodes = self._nodes
        if old is None:
            record = NodeRecord(inventory)
            changes = KeyChanges(set(), record.by_name.keys(), set(), record.by_id.keys())
            at = bisect.bisect(nodes, node)
            nodes = (*nodes[:at], node, *nodes[at:])
        else:
            record, changes = old.revised(inventory)
        records = self._records.set(node, record)
        return self._reindexed(node, old, record, changes, records, nodes, seen_at)

    def remove(self, node: str, seen_at: float | None = None) -> FleetSnapshot:
        old = self._records.get(node)
        if old is None:
            return self
        nodes = tuple(n for n in self._nodes if n != node)
        changes = KeyChanges(old.by_name.keys(), set(), old.by_id.keys(), set())
        records = self._records.delete(node)
        return self._reindexed(node, old, None, changes, records, nodes, seen_at)

    def _reindexed(
        self,
        node: str,
        old: NodeRecord | None,
        new: NodeRecord | None,
        changes: KeyChanges,
        records: immutables.Map[str, NodeRecord],
        nodes: tuple[str, ...],
        seen_at: float | None,
    ) -> FleetSnapshot:
        by_name = _NodeSetIndex.update(self._by_name, node, changes.names_gone, changes.names_added)
        by_id = _NodeSetIndex.update(self._by_id, node, changes.ids_gone, changes.ids_added)
        warm = self._reindex_warm(node, old, new)
        newest, newest_seen_at = self._newest_after(old, new, records, seen_at)
        stalls = self._stalls_after(newest, seen_at)
        return FleetSnapshot(
            records,
            nodes,
            by_name,
            by_id,
            warm,
            newest,
            newest_seen_at,
            self.stall_after,
            stalls,
        )

    def _reindex_warm(
        self, node: str, old: NodeRecord | None, new: NodeRecord | None
    ) -> immutables.Map[PoolKey, tuple[WarmCandidate, ...]]:
        before = old.warm if old else {}
        after = new.warm if new else {}
        address = new.inventory.address if new else ""
        same_address = old is not None and new is not None and old.inventory.address == address
        if before == after and same_address:
            return self._warm
        mutation = self._warm.mutate()
        for key in before.keys() | after.keys():
            kept = [c for c in mutation.get(key, ()) if c.node != node]
            if key in after:
                bisect.insort(kept, WarmCandidate(node, address, after[key]), key=_by_node)
            if kept:
                mutation[key] = tuple(kept)
            else:
                del mutation[key]
        return mutation.finish()

    def _newest_after(
        self,
        old: NodeRecord | None,
        new: NodeRecord | None,
        records: immutables.Map[str, NodeRecord],
        seen_at: float | None,
    ) -> tuple[datetime | None, float | None]:
        stamp = new.stamp if new else None
        newest = self.newest
        if stamp is not None and (newest is None or stamp > newest):
            return stamp, seen_at
        if stamp is not None and stamp == newest:  # still the newest: nothing to look for
            return newest, self.newest_seen_at
        if old is not None and old.stamp is not None and old.stamp == newest:
            # The node that set the newest stamp went back or left: take the next newest.
            stamps = [r.stamp for r in records.values() if r.stamp is not None]
            recomputed = max(stamps) if stamps else None
            if recomputed != newest:
                return recomputed, seen_at
        return newest, self.newest_seen_at

    def _stalls_after(self, newest: datetime | None, seen_at: float | None) -> tuple[Stall, ...]:
        """Record a stall when the newest stamp moves on after a long silence."""
        old = self.newest
        if (
            self.stall_after is None
            or old is None
            or newest is None
            or newest <= old
            or seen_at is None
            or self.newest_seen_at is None
        ):
            return self.stalls
        silence = timedelta(seconds=seen_at - self.newest_seen_at)
        excess = min(newest - old, silence) - self.stall_after
        if excess <= timedelta(0):
            return self.stalls
        return (*self.stalls, Stall(old, excess))[-MAX_STALLS:]

    # --- raw reads (no freshness applied) ----------------------------------------------

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every node, stale or not, in name order."""
        return self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def record(self, node: str) -> NodeRecord | None:
        return self._records.get(node)

    def view(self, rule: FreshnessRule, now: datetime, monotonic: float | None = None) -> FleetView:
        """This snapshot read under ``rule`` at the reader's ``now`` (and monotonic clock)."""
        reference = rule.reference(self.newest, now, self.newest_seen_at, monotonic)
        return FleetView(self, rule, reference, now)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Every object a build allocates survives it, so the cyclic collector's passes over
    them are pure cost: with it running, a 200x2000 build takes about five times longer.
    (Also used by the store's ledger for its first build, and by the kube source around
    each event: a pass in the middle of one walks containers of thousands of entries
    spread over the fleet's memory, half an event's time, and finds no cycle to free.)

    The switch is the process's, so pauses are counted: the first of overlapping pauses
    (from any thread) turns the collector off, and the last to end restores what the
    first found."""
    with _PAUSES.lock:
        if _PAUSES.count == 0:
            _PAUSES.was_enabled = gc.isenabled()
            gc.disable()
        _PAUSES.count += 1
    try:
        yield
    finally:
        with _PAUSES.lock:
            _PAUSES.count -= 1
            if _PAUSES.count == 0 and _PAUSES.was_enabled:
                gc.enable()


class _Pauses:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0  # pauses under way
        self.was_enabled = True  # the collector's state when the first of them began


_PAUSES = _Pauses()


def _by_node(candidate: WarmCandidate) -> str:
    return candidate.node


class FleetView:
    """A snapshot with the freshness rule applied: stale nodes are invisible through it."""

    __slots__ = ("_cutoff", "now", "reference", "rule", "snapshot")

    def __init__(
        self, snapshot: FleetSnapshot, rule: FreshnessRule, reference: Reference, now: datetime
    ) -> None:
        self.snapshot = snapshot
        self.rule = rule
        self.reference = reference
        self.now = now
        self._cutoff = rule.cutoff(reference)

    def _fresh_record(self, node: str) -> NodeRecord | None:
        record = self.snapshot._records.get(node)
        if record is None:
            return None
        stamp = record.inventory.published_at
        if stamp is None or self._cutoff is None or stamp >= self._cutoff:
            return record
        if self.snapshot.stalls and stamp + self.credit(stamp) >= self._cutoff:
            return record
        return None

    def credit(self, stamp: datetime) -> timedelta:
        """Stall time not held against a node stamped at ``stamp``."""
        return sum(
            (s.excess for s in self.snapshot.stalls if stamp <= s.before), start=timedelta(0)
        )

    def age(self, node: str) -> timedelta | None:
        """How far the node's stamp trails the reference, less any stall credit."""
        record = self.snapshot._records.get(node)
        stamp = record.stamp if record else None
        if stamp is None or self.reference.at is None:
            return None
        return self.reference.at - stamp - self.credit(stamp)

    def is_fresh(self, node: str) -> bool:
        return self._fresh_record(node) is not None

    def state(self, node: str) -> NodeState:
        record = self.snapshot._records.get(node)
        stamp = record.stamp if record else None
        credit = self.credit(stamp) if stamp is not None else timedelta(0)
        return self.rule.state(stamp, self.reference, self.now, credit)

    def fresh_nodes(self) -> list[str]:
        """Fresh nodes in name order."""
        return [n for n in self.snapshot._nodes if self._fresh_record(n) is not None]

    def inventory(self, node: str) -> NodeInventory | None:
        """A fresh node's inventory; None when the node is unknown or stale."""
        record = self._fresh_record(node)
        return record.inventory if record else None

    def lookup_name(self, namespace: str, name: str) -> list[Located]:
        """Every fresh node's entry under this name, in node order (a name may be held twice)."""
        key = (namespace, name)
        found = []
        for node in self.snapshot._by_name.get(key, ()):
            record = self._fresh_record(node)
            if record is not None:
                found.append(Located(node, record.by_name[key]))
        return found

    def lookup_claim_id(self, claim_id: str) -> Located | None:
        for node in self.snapshot._by_id.get(claim_id, ()):
            record = self._fresh_record(node)
            if record is not None:
                return Located(node, record.by_id[claim_id])
        return None

    def warm_candidates(self, key: PoolKey) -> list[WarmCandidate]:
        """Fresh nodes with an address and warm sandboxes for ``key``, in node order."""
        return [c for c in self.snapshot._warm.get(key, ()) if self._fresh_record(c.node)]

    def entries(self, namespace: str | None = None) -> Iterator[Located]:
        """Every entry on fresh nodes, node by node; ``namespace`` None means all."""
        for node in self.snapshot._nodes:
            record = self._fresh_record(node)
            if record is None:
                continue
            for entry in record.inventory.entries:
                if namespace is None or entry.namespaced_name[0] == namespace:
                    yield Located(node, entry)

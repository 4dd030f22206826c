"""The ledger: every sandbox this server can read, as one Kubernetes object per name with a
resourceVersion, and the bounded log of changes that a watch resumes from.

Objects are synthesized from inventories, so their versions come from here, not from a
database: each change this server observes (a node republished, went stale, or a write
through this server) gets the next number of one per-server counter, and the changed
object carries it as ``metadata.resourceVersion``. An unchanged object keeps its version.
The counter starts at the wall clock in microseconds, so a restarted server never hands
out a version an earlier run gave: a client resuming from an old one gets 410 Gone and
relists, as it would after etcd compaction. Versions are per server; a client that moves
to another replica relists the same way.

A name held on several nodes is one object: the first node, in node-name order, that
holds it (the order of ``FleetView.lookup_name``). Every query sees that same object, but
for a pinned one (a namespace and ``metadata.name=``) whose selectors reject it: that
query sees the first other holder they accept (``Held.visible``), so a rejected duplicate
cannot hide an accepted one. A pinned list and a pinned watch agree, and so do a list and
a watch that are not pinned.

``sync`` is incremental: it keeps each node's record as last read and rescans only the
nodes whose record object is not that one (a republish, or an overlay of this server's
writes) or that went stale or left. A sync whose inputs are the ones it last saw returns
at once. An object is built only when an entry of its name changes; ``Sandbox``
objects are the ledger's, built once per inventory change, never per read; the other
holders' objects of a duplicate name are rebuilt at each change of that name, so whichever
holder a pinned watch shows carries the version of the change that showed it.

The log keeps the last ``retain`` changes; a watch from a version older than that, or
from one this server never gave, is told ``Expired`` (410).
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import immutables

from sandboxctl.core.model import Entry
from sandboxctl.core.sandboxes import sandbox_object
from sandboxctl.core.snapshot import Located, NodeRecord, collector_paused
from sandboxctl.core.watching import ADDED, DELETED, MODIFIED
from sandboxctl.store.errors import Expired

Name = tuple[str, str]  # (namespace, name): sorts as a list does
Object = dict[str, Any]

DEFAULT_RETAIN: Final = 10_000


@dataclass(frozen=True, slots=True)
class Held:
    """What a name reads as: the node and entry that won it, and its served object;
    ``others``, the name's other holders in node-name order (duplicates: usually none)."""

    located: Located
    object: Object
    others: tuple[Held, ...] = ()

    @property
    def version(self) -> int:
        return int(self.object["metadata"]["resourceVersion"])

    def visible(self, accepts: Callable[[Located], bool]) -> Held | None:
        """What a pinned query sees: the first holder, in node-name order, it accepts."""
        if accepts(self.located):
            return self
        return next((other for other in self.others if accepts(other.located)), None)


@dataclass(frozen=True, slots=True)
class Change:
    """One logged change. ``held`` is the new state (for DELETED, the last one);
    ``before`` the state it replaced (None for ADDED)."""

    version: int
    type: str
    name: Name
    held: Held
    before: Held | None


@dataclass(slots=True)
class State:
    """Every object at one version; never changes once made (the map is persistent).

    Its sorted names are made when first asked for: from the nearest earlier state that
    has them (``origin``) and the names added and removed since, in O(names) without a
    sort, or by sorting when there is no such state or the difference is large."""

    version: int
    held: immutables.Map[Name, Held]
    _names: list[Name] | None = field(default=None, repr=False)
    _origin: State | None = field(default=None, repr=False)
    _added: frozenset[Name] = field(default=frozenset(), repr=False)
    _removed: frozenset[Name] = field(default=frozenset(), repr=False)

    def names(self) -> list[Name]:
        """Every name, sorted as a list answers them."""
        if self._names is None:
            origin = self._origin
            if origin is not None and origin._names is not None:
                kept = origin._names
                if self._removed:
                    kept = [name for name in kept if name not in self._removed]
                self._names = list(heapq.merge(kept, sorted(self._added)))
            else:
                self._names = sorted(self.held)
            self._origin = None  # let the older state go
        return self._names

    def after(self, version: int, held: immutables.Map[Name, Held], changes: list[Change]) -> State:
        """The next state: this one with ``changes`` applied (``held`` already has them)."""
        added = {c.name for c in changes if c.type == ADDED}
        removed = {c.name for c in changes if c.type == DELETED}
        since_added: frozenset[Name] = frozenset()
        since_removed: frozenset[Name] = frozenset()
        if self._names is not None or self._origin is None:
            origin = self
        else:  # carry the difference from this state's origin forward
            origin, since_added, since_removed = self._origin, self._added, self._removed
        base = origin.held
        all_added = (since_added - removed) | {n for n in added if n not in base}
        all_removed = (since_removed - added) | {n for n in removed if n in base}
        if (len(all_added) + len(all_removed)) * 4 > len(base) or origin._names is None:
            return State(version, held)  # sorting anew is as cheap
        return State(version, held, None, origin, frozenset(all_added), frozenset(all_removed))


class Ledger:
    """Thread-safe; ``sync`` is serialized, reads take a consistent ``state()``."""

    def __init__(
        self,
        retain: int = DEFAULT_RETAIN,
        first_version: int | None = None,
    ) -> None:
        if retain < 1:
            raise ValueError("the ledger must retain at least one change")
        self._retain = retain
        self._lock = threading.Lock()
        self._inputs: tuple[object, ...] | None = None
        self._nodes: dict[str, tuple[NodeRecord, dict[Name, Entry]]] = {}
        self._holders: dict[Name, tuple[str, ...]] = {}
        version = first_version if first_version is not None else time.time_ns() // 1000
        self._state = State(version, immutables.Map())
        self._log: list[Change] = []
        self._compacted = version  # every change after this version is in the log
        self._listeners: dict[object, Callable[[], None]] = {}  # by subscription
        self._synced = False
        self.rescans = 0  # node records read by syncs, for tests and benchmarks

    # --- reads ------------------------------------------------------------------------

    def state(self) -> State:
        return self._state

    @property
    def version(self) -> int:
        return self._state.version

    @property
    def synced(self) -> bool:
        """Whether the ledger was ever built (nothing reads it before then)."""
        return self._synced

    def since(self, version: int) -> list[Change]:
        """Every change after ``version``, in order. Raises Expired when the log no
        longer holds them all, or when this server never gave ``version``."""
        with self._lock:
            head = self._state.version
            if version < self._compacted or version > head:
                raise Expired(version, self._compacted, head)
            if version == head:
                return []
            first = self._log[0].version
            return self._log[version - first + 1 :]

    def check(self, version: int) -> None:
        """Raise Expired unless a watch can resume from ``version``."""
        self.since(version)

    def retained(self) -> int:
        return len(self._log)

    # --- notification ---------------------------------------------------------------

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` (from the syncing thread) after each sync that logged a
        change; returns the function that unsubscribes it."""
        token = object()
        with self._lock:
            self._listeners[token] = listener

        def unsubscribe() -> None:
            with self._lock:
                self._listeners.pop(token, None)

        return unsubscribe

    # --- sync -------------------------------------------------------------------------

    def sync(
        self,
        inputs: tuple[object, ...],
        fresh: Callable[[], Sequence[tuple[str, NodeRecord]]],
    ) -> bool:
        """Bring the objects up to the fresh nodes ``fresh()`` returns (node-name order).

        ``inputs`` identify what decides that set (a snapshot, a freshness cutoff, an
        overlay version): when they are the ones last synced, nothing is read. Returns
        whether anything changed."""
        with self._lock:
            if self._inputs is not None and _same(inputs, self._inputs):
                return False
            records = fresh()
            if not self._synced:  # the first build: every object it makes survives it
                with collector_paused():
                    changes = self._sync(records)
            else:
                changes = self._sync(records)
            self._inputs = inputs
            listeners = list(self._listeners.values()) if changes else []
        for listener in listeners:
            listener()
        return bool(changes)

    def _sync(self, fresh: Sequence[tuple[str, NodeRecord]]) -> list[Change]:
        kept = self._nodes
        now = dict(fresh)
        touched: set[Name] = set()
        holders = self._holders
        for node in [n for n in kept if n not in now]:
            for name in kept.pop(node)[1]:
                _drop_holder(holders, name, node)
                touched.add(name)
        for node, record in fresh:
            last = kept.get(node)
            if last is not None and last[0] is record:
                continue
            self.rescans += 1
            before = last[1] if last is not None else {}
            after = record.by_name
            for name, entry in after.items():
                old = before.get(name)
                if old is None:
                    _add_holder(holders, name, node)
                    touched.add(name)
                elif old is not entry and old != entry:
                    touched.add(name)
            for name in before:
                if name not in after:
                    _drop_holder(holders, name, node)
                    touched.add(name)
            kept[node] = (record, after)  # a record never changes once built
        return self._settle(touched)

    def _settle(self, touched: Iterable[Name]) -> list[Change]:
        """Log a change for every touched name whose holders' entries are not the ones held."""
        state = self._state
        held = state.held
        mutation = held.mutate()
        version = state.version
        initial = not self._synced  # the first build: every object at the first version
        changes: list[Change] = []
        for name in sorted(touched):
            last = held.get(name)
            next_version = version if initial else version + 1
            nodes = self._holders.get(name)
            if not nodes:
                if last is None:
                    continue
                del mutation[name]
                if initial:
                    continue
                # The last objects, at the version of their deletion.
                changes.append(Change(next_version, DELETED, name, _gone(last, next_version), last))
            else:
                now = self._holding(name, nodes, last, str(next_version))
                if now is None:
                    continue
                mutation[name] = now
                if initial:
                    continue
                kind = ADDED if last is None else MODIFIED
                changes.append(Change(next_version, kind, name, now, last))
            version = next_version
        self._synced = True
        self._commit(state, version, mutation.finish(), changes, initial)
        return changes

    def _holding(
        self, name: Name, nodes: tuple[str, ...], last: Held | None, rv: str
    ) -> Held | None:
        """What ``name`` holds now that ``nodes`` (node-name order) list it: the first
        node's entry, the others' as duplicates; None when ``last`` holds just that. A
        change of a duplicate alone keeps the winner's object as it was."""
        node = nodes[0]
        entry = self._nodes[node][1][name]
        duplicates = [Located(n, self._nodes[n][1][name]) for n in nodes[1:]]
        kept = last is not None and last.located.node == node and last.located.entry == entry
        if last is not None and kept:
            if [o.located for o in last.others] == duplicates:
                return None
            now = Held(last.located, last.object)
        else:
            located = Located(node, entry)
            now = Held(located, sandbox_object(located, rv))
        if duplicates:
            now = Held(now.located, now.object, tuple(_held(d, rv) for d in duplicates))
        return now

    def _commit(
        self,
        state: State,
        version: int,
        held: immutables.Map[Name, Held],
        changes: list[Change],
        initial: bool,
    ) -> None:
        """Make the settled objects the state, and log their changes."""
        if initial:
            self._state = State(version, held)
        elif changes:
            self._state = state.after(version, held, changes)
        if changes:
            self._log.extend(changes)
            overflow = len(self._log) - self._retain
            if overflow >= self._retain:  # trim in batches: amortized O(1) per change
                self._compacted = self._log[overflow - 1].version
                del self._log[:overflow]


def _held(located: Located, version: str) -> Held:
    return Held(located, sandbox_object(located, version))


def _gone(last: Held, version: int) -> Held:
    others = tuple(_gone(other, version) for other in last.others)
    return Held(last.located, at_version(last.object, version), others)


def at_version(obj: Object, version: int) -> Object:
    """``obj`` as served at ``version``."""
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(version)}}


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return len(a) == len(b) and all(x is y or x == y for x, y in zip(a, b, strict=True))


def _add_holder(holders: dict[Name, tuple[str, ...]], name: Name, node: str) -> None:
    nodes = holders.get(name, ())
    holders[name] = tuple(sorted((*nodes, node)))


def _drop_holder(holders: dict[Name, tuple[str, ...]], name: Name, node: str) -> None:
    nodes = tuple(n for n in holders.get(name, ()) if n != node)
    if nodes:
        holders[name] = nodes
    else:
        holders.pop(name, None)

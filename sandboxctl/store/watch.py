"""Watches: an opening burst, then one poll per tick, reporting what changed.

Every watch replays the current view as ADDED when it opens, whatever resourceVersion
it asked from: objects are synthesized, so there is no history to resume from.

A watch pinned to one name (a namespaced query with ``metadata.name=``) never reads the
fleet while it holds an entry: each tick reads only the inventory of the node holding it.
While it holds none, its ticks sweep the inventories for the first entry its selectors
accept, asking no agent, so an absent name costs no node a request after the watch opens
(opening resolves the name like a get, which with claim routing asks every fresh node
once). When a held entry vanishes
from its node's inventory but the node still lists it live (the publish has not caught
up), the watch keeps it silently.

A fleet watch (any other query) keeps, per fresh node, the ``NodeRecord`` it last read
and that node's entries the query accepts as Sandbox objects. A snapshot replaces a
node's record object only when that node's inventory is replaced, so a tick reads the
fresh node set (O(nodes)) and rescans only the nodes whose record is not the one it
kept, plus the nodes that went stale or left (dropped unread); an idle tick builds no
object, and one that finds the same snapshot object at the same freshness cutoff as the
last does not even list the nodes. Rescanning a node reuses the object of every entry
equal to the one it was built from (the object depends on nothing else but the node),
so a republish costs a Sandbox object only per entry that changed. Opening reads every
fresh node: one fleet read in ``store.stats``; a tick counts one node read per node
it rescans.

A name held on several nodes is one object to a fleet watch: the one from the first
node, in node-name order, whose entry under that name the query accepts (the order of
``FleetView.lookup_name``). A node's entry under a name is the first in its publish
order (``NodeRecord.by_name``). The watch reports ADDED when a name appears, MODIFIED
when its object's resourceVersion changes (also when another node takes over with a
different entry), and DELETED, with the last object sent, when no node holds it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sandboxctl.core.model import Entry
from sandboxctl.core.sandboxes import fnv1a_64, sandbox_object
from sandboxctl.core.snapshot import FleetSnapshot, FleetView, Located, NodeRecord
from sandboxctl.core.watching import (
    ADDED,
    DELETED,
    MODIFIED,
    WatchEvent,
    bookmark,
    diff,
    opening_burst,
)
from sandboxctl.store.store import Query, SandboxStore

Name = tuple[str, str]  # (namespace, name): sorts as a list does
Object = dict[str, Any]


@dataclass(slots=True)
class _Scanned:
    """One node as a fleet watch last read it: the record object, and for each name in
    the query's namespace the entry read and its object (None: the query rejects it)."""

    record: NodeRecord
    seen: dict[Name, tuple[Entry, Object | None]]


class Watcher:
    """Not thread-safe: one caller drives ``open`` once, then ``tick`` repeatedly."""

    def __init__(self, store: SandboxStore, query: Query) -> None:
        self.store = store
        self.query = query
        self.pinned = query.pin is not None
        self._known: dict[str, dict[str, Any]] = {}  # pinned: what the diff last sent
        self._held: Located | None = None
        self._nodes: dict[str, _Scanned] = {}  # fleet: every fresh node at the last poll
        self._holders: dict[Name, tuple[str, ...]] = {}  # fleet: accepting nodes, sorted
        self._read: tuple[FleetSnapshot, datetime | None] | None = None  # fleet: last read

    def open(self, send_initial_events: bool = False) -> list[WatchEvent]:
        if self.pinned:
            self._held = self.store.list_pinned(self.query)
            current = [self._held] if self._held is not None else []
            objects = [sandbox_object(located) for located in current]
            self._known = {_key(obj): obj for obj in objects}
        else:
            objects = self._open_fleet()
        events = opening_burst(objects)
        if send_initial_events:
            events.append(bookmark(list_version(objects)))
        return events

    def tick(self) -> list[WatchEvent]:
        if not self.pinned:
            return self._tick_fleet()
        current = self._poll_pinned()
        objects = {_key(obj): obj for obj in map(sandbox_object, current)}
        events, self._known = diff(self._known, objects, self._held_by_node)
        return events

    def known(self) -> dict[str, dict[str, Any]]:
        """What the watch holds, keyed ``"<namespace>/<name>"``: the latest object of every
        name it reported and has not deleted (an update that keeps the resourceVersion
        replaces it without an event), which is what a watch opened now would send."""
        if self.pinned:
            return dict(self._known)
        return {f"{ns}/{name}": self._winner((ns, name)) for ns, name in sorted(self._holders)}

    # --- fleet --------------------------------------------------------------------------

    def _open_fleet(self) -> list[Object]:
        """Read every fresh node (one fleet read); the objects sent, one per name, sorted."""
        view = self.store.view()
        self.store.stats.fleet_reads += 1
        read = _freshness_inputs(view)
        nodes: dict[str, _Scanned] = {}
        holders: dict[Name, tuple[str, ...]] = {}
        for node, record in _fresh_records(view):  # in node-name order: holders sorted
            scanned = _Scanned(record, self._scan(node, record, {}))
            nodes[node] = scanned
            for name, (_, obj) in scanned.seen.items():
                if obj is not None:
                    holders[name] = (*holders.get(name, ()), node)
        self._nodes, self._holders, self._read = nodes, holders, read
        return [self._winner(name) for name in sorted(holders)]

    def _tick_fleet(self) -> list[WatchEvent]:
        view = self.store.view()
        read = _freshness_inputs(view)
        last_read = self._read
        if last_read is not None and read[0] is last_read[0] and read[1] == last_read[1]:
            return []  # the same snapshot and cutoff: the same fresh nodes and records
        fresh = dict(_fresh_records(view))
        kept = self._nodes
        changed = [
            (node, record)
            for node, record in fresh.items()
            if (last := kept.get(node)) is None or last.record is not record
        ]
        # Every read comes first, so a failed poll leaves the state as it was.
        rescanned: dict[str, _Scanned | None] = {node: None for node in kept if node not in fresh}
        for node, record in changed:
            self.store.stats.node_reads += 1
            last = kept.get(node)
            rescanned[node] = _Scanned(record, self._scan(node, record, last.seen if last else {}))

        moves = [self._move(node, now) for node, now in rescanned.items()]
        touched = {name for _, gained, lost, others in moves for name in (*gained, *lost, *others)}
        sent = {name: self._winner(name) for name in touched if name in self._holders}
        for node, now in rescanned.items():
            if now is None:
                del kept[node]
            else:
                kept[node] = now
        for node, gained, lost, _ in moves:
            self._hold(node, gained, lost)
        self._read = read

        # As core.watching.diff orders them: ADDED and MODIFIED, then DELETED, by name.
        events: list[WatchEvent] = []
        deleted: list[WatchEvent] = []
        for name in sorted(touched):
            last_sent = sent.get(name)
            if name not in self._holders:
                if last_sent is not None:
                    deleted.append(WatchEvent(DELETED, last_sent))
                continue
            obj = self._winner(name)
            if last_sent is None:
                events.append(WatchEvent(ADDED, obj))
            elif _version(last_sent) != _version(obj):
                events.append(WatchEvent(MODIFIED, obj))
        return events + deleted

    def _move(
        self, node: str, now: _Scanned | None
    ) -> tuple[str, list[Name], list[Name], list[Name]]:
        """How a node's rescan (None: it went stale or left) moves its names: the names it
        now holds and did not, those it held and no longer does, and those it holds with
        a new object. Any other name's object and holders are as they were."""
        last = self._nodes.get(node)
        before = last.seen if last else {}
        after = now.seen if now else {}
        gained, lost, others = [], [], []
        for name, (_, obj) in after.items():
            old = before.get(name)
            old_obj = old[1] if old else None
            if obj is old_obj:
                continue
            if old_obj is None:
                gained.append(name)
            elif obj is None:
                lost.append(name)
            else:
                others.append(name)
        for name, (_, old_obj) in before.items():
            if old_obj is not None and name not in after:
                lost.append(name)
        return node, gained, lost, others

    def _hold(self, node: str, gained: list[Name], lost: list[Name]) -> None:
        holders = self._holders
        for name in lost:
            holding = tuple(n for n in holders[name] if n != node)
            if holding:
                holders[name] = holding
            else:
                del holders[name]
        for name in gained:
            holding = holders.get(name, ())
            at = bisect.bisect(holding, node)
            holders[name] = (*holding[:at], node, *holding[at:])

    def _scan(
        self, node: str, record: NodeRecord, last: dict[Name, tuple[Entry, Object | None]]
    ) -> dict[Name, tuple[Entry, Object | None]]:
        """Each of the node's names in the query's namespace, with the entry's object when
        the query accepts it. An entry equal to the one ``last`` read under its name keeps
        its verdict and object: both depend only on the node and the entry."""
        namespace = self.query.namespace
        accepts = self.query.accepts
        seen: dict[Name, tuple[Entry, Object | None]] = {}
        for name, entry in record.by_name.items():
            if namespace is not None and name[0] != namespace:
                continue
            previous = last.get(name)
            if previous is not None and (previous[0] is entry or previous[0] == entry):
                seen[name] = previous
                continue
            located = Located(node, entry)
            seen[name] = (entry, sandbox_object(located) if accepts(located) else None)
        return seen

    def _winner(self, name: Name) -> Object:
        """The object a name reads as: the first accepting node's (the name is held)."""
        obj = self._nodes[self._holders[name][0]].seen[name][1]
        assert obj is not None
        return obj

    # --- pinned -------------------------------------------------------------------------

    def _poll_pinned(self) -> list[Located]:
        store = self.store
        view = store.view()
        if self._held is not None:
            store.stats.node_reads += 1
            record = view.snapshot.record(self._held.node)
            if record is not None and view.is_fresh(self._held.node) and self.query.pin:
                entry = record.by_name.get(self.query.pin)
                if entry is not None:
                    located = Located(self._held.node, entry)
                    if self.query.accepts(located):
                        self._held = located
                        return [located]
            if view.is_fresh(self._held.node) and store.held_by_node(self._held, self.query):
                return []  # kept silently by the diff's keep check
            # Lost: report it gone on this tick; a holder elsewhere is found on the next,
            # so a move between nodes reads as DELETED then ADDED.
            self._held = None
            return []
        found = store.first_accepted(view, self.query)
        self._held = found
        return [found] if found is not None else []

    def _held_by_node(self, key: str, last: dict[str, Any]) -> bool:
        held = self._held
        return held is not None and _key(sandbox_object(held)) == key


def list_version(objects: list[dict[str, Any]]) -> str:
    """A list's resourceVersion: a digest of its items' versions (opaque to clients)."""
    joined = "|".join(str(obj["metadata"].get("resourceVersion", "")) for obj in objects)
    return str(fnv1a_64(joined.encode()))


def _fresh_records(view: FleetView) -> list[tuple[str, NodeRecord]]:
    """Every fresh node with its record, in node-name order."""
    records = []
    for node in view.fresh_nodes():
        record = view.snapshot.record(node)
        assert record is not None  # a fresh node has a record
        records.append((node, record))
    return records


def _freshness_inputs(view: FleetView) -> tuple[FleetSnapshot, datetime | None]:
    """What decides which nodes a view holds fresh: its snapshot (the records and their
    stall credit) and the cutoff its rule draws at its reference. The same snapshot
    object at an equal cutoff holds the same nodes fresh."""
    return view.snapshot, view.rule.cutoff(view.reference)


def _version(obj: Object) -> object:
    return obj["metadata"].get("resourceVersion")


def _key(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}"

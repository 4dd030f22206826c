"""Watches: an opening burst, then one poll per tick diffed against what was known.

Every watch replays the current view as ADDED when it opens, whatever resourceVersion
it asked from: objects are synthesized, so there is no history to resume from.

A watch pinned to one name (a namespaced query with ``metadata.name=``) never reads the
fleet while it holds an entry: each tick reads only the inventory of the node holding it.
While it holds none, it sweeps the inventories for the first entry its selectors accept,
asking no agent, so an absent name costs no node a request. When a held entry vanishes
from its node's inventory but the node still lists it live (the publish has not caught
up), the watch keeps it silently.
"""

from __future__ import annotations

from typing import Any

from sandboxctl.core.sandboxes import fnv1a_64, sandbox_object
from sandboxctl.core.snapshot import Located
from sandboxctl.core.watching import WatchEvent, bookmark, diff, never, opening_burst
from sandboxctl.store.store import Query, SandboxStore


class Watcher:
    """Not thread-safe: one caller drives ``open`` once, then ``tick`` repeatedly."""

    def __init__(self, store: SandboxStore, query: Query) -> None:
        self.store = store
        self.query = query
        self.pinned = query.pin is not None
        self._known: dict[str, dict[str, Any]] = {}
        self._held: Located | None = None

    def open(self, send_initial_events: bool = False) -> list[WatchEvent]:
        if self.pinned:
            self._held = self.store.list_pinned(self.query)
            current = [self._held] if self._held is not None else []
        else:
            current = self.store.sweep(self.store.view(), self.query)
        objects = [sandbox_object(located) for located in current]
        self._known = {_key(obj): obj for obj in objects}
        events = opening_burst(objects)
        if send_initial_events:
            events.append(bookmark(list_version(objects)))
        return events

    def tick(self) -> list[WatchEvent]:
        if self.pinned:
            current = self._poll_pinned()
            keep = self._held_by_node
        else:
            current = self.store.sweep(self.store.view(), self.query)
            keep = never
        objects = {_key(obj): obj for obj in map(sandbox_object, current)}
        events, self._known = diff(self._known, objects, keep)
        return events

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


def _key(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}"

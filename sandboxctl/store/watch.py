"""Watches: a cursor into the ledger's log, filtered by a query, with Kubernetes semantics.

A watch opened from a resourceVersion delivers only the changes after it, in order. One
opened without one (or with ``"0"``), or with ``sendInitialEvents``, first sends every
object the query accepts as ADDED, sorted, from one consistent state, and then the
changes after that state's version; ``sendInitialEvents`` ends that burst with the
BOOKMARK annotated ``k8s.io/initial-events-end``. A version the log no longer holds, or
one this server never gave, raises Expired (the API answers 410 Gone, and clients
relist).

A change is filtered as the kube-apiserver's watch cache does: an object that starts to
match the query is ADDED, one that stops matching is DELETED (carrying the new object),
and one that matches before and after is MODIFIED. A pinned watch (a namespaced query
with ``metadata.name=``) is the same cursor; it skips every other name without looking
at its selectors, so its tick costs the changes since the last, never the fleet. It
follows what a pinned list answers: the first holder of the name its selectors accept
(``Held.visible``), so a duplicate can show through one the selectors reject.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandboxctl.core.watching import ADDED, DELETED, MODIFIED, WatchEvent, bookmark
from sandboxctl.store.ledger import Change, Held, at_version
from sandboxctl.store.lists import select

if TYPE_CHECKING:
    from sandboxctl.store.query import Query
    from sandboxctl.store.reads import FleetReads


class Watch:
    """Not thread-safe: one caller drives ``open`` once, then ``poll`` repeatedly."""

    def __init__(
        self,
        store: FleetReads,
        query: Query,
        resource_version: int | None = None,
        send_initial_events: bool = False,
    ) -> None:
        self._store = store
        self._query = query
        self._from = resource_version
        self._initial = send_initial_events or resource_version is None
        self._send_end = send_initial_events
        self._cursor: int | None = None

    @property
    def version(self) -> int:
        """The version of the last change this watch has seen."""
        if self._cursor is None:
            raise RuntimeError("the watch is not open")
        return self._cursor

    def open(self) -> list[WatchEvent]:
        """The opening events. Raises Expired for a version it cannot resume from."""
        store = self._store
        if not self._initial:
            assert self._from is not None
            store.check_version(self._from)
            self._cursor = self._from
            return self.poll()
        state = store.state()
        events = [WatchEvent(ADDED, held.object) for held in select(state, self._query)]
        self._cursor = state.version
        if self._send_end:
            events.append(bookmark(str(state.version), initial_events_end=True))
        return events + self.poll()

    def poll(self) -> list[WatchEvent]:
        """What changed since the last call, filtered; raises Expired when the watch fell
        further behind than the log retains."""
        changes = self._store.changes_since(self.version)
        if not changes:
            return []
        self._cursor = changes[-1].version
        pin = self._query.pin
        events = []
        for change in changes:
            if pin is not None and change.name != pin:
                continue
            event = self._filtered(change)
            if event is not None:
                events.append(event)
        return events

    def progress(self) -> WatchEvent:
        """A BOOKMARK at the current version (for ``allowWatchBookmarks``)."""
        return bookmark(str(self.version))

    def _visible(self, held: Held | None) -> Held | None:
        """What this watch sees of a name: the winner if accepted, or for a pinned watch
        the first holder accepted (as its list answers)."""
        if held is None:
            return None
        if self._query.pin is not None:
            return held.visible(self._query.accepts)
        return held if self._query.accepts(held.located) else None

    def _filtered(self, change: Change) -> WatchEvent | None:
        was = self._visible(change.before)
        if change.type == DELETED:
            gone = self._visible(change.held)
            return WatchEvent(DELETED, gone.object) if gone is not None else None
        now = self._visible(change.held)
        if now is not None and was is not None:
            # The same object: a change of a holder this watch does not show. (The ledger
            # serves a name's other holders at the version of its latest change, so a
            # watch that shows one of them gets MODIFIED at that version, as a list would.)
            if now.object is was.object:
                return None
            return WatchEvent(MODIFIED, now.object)
        if now is not None:
            return WatchEvent(ADDED, now.object)
        if was is not None:  # stopped matching: the new state of what it showed, or
            # its last state at this change's version when its holder is gone
            holders = (change.held, *change.held.others)
            still = next((h for h in holders if h.located.node == was.located.node), None)
            shown = still.object if still is not None else at_version(was.object, change.version)
            return WatchEvent(DELETED, shown)
        return None

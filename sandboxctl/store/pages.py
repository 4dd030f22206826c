"""Pages ordered by a sort key (the e2b listing's (startedAt, sandboxID)), served without
building every listed sandbox.

Each node's entries are kept sorted per namespace, rebuilt only when that node's record
changes (a republish, or this server's own write); a page merges the fresh nodes' sorted
runs from the cursor on and stops once it has ``limit + 1`` matches.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

from sandboxctl.core.model import Entry
from sandboxctl.core.snapshot import Located, NodeRecord

SortKey = tuple[datetime, str]
KeyOf = Callable[[Entry], Any]


class _Run:
    """One node's entries of one namespace, sorted by their key."""

    __slots__ = ("entries", "keys")

    def __init__(self, entries: Iterable[Entry], key: KeyOf) -> None:
        pairs = sorted(((key(e), e) for e in entries if e.id), key=lambda p: p[0])
        self.keys = [k for k, _ in pairs]
        self.entries = [e for _, e in pairs]

    def after(self, cursor: Any, descending: bool) -> Iterator[tuple[Any, Entry]]:
        if descending:
            start = len(self.keys) if cursor is None else bisect.bisect_left(self.keys, cursor)
            for i in range(start - 1, -1, -1):
                yield self.keys[i], self.entries[i]
        else:
            start = 0 if cursor is None else bisect.bisect_right(self.keys, cursor)
            for i in range(start, len(self.keys)):
                yield self.keys[i], self.entries[i]


class SortedIndex:
    """Sorted runs per (node, namespace) for one sort key; thread-safe."""

    def __init__(self, key: KeyOf) -> None:
        self._key = key
        self._lock = threading.Lock()
        self._nodes: dict[str, tuple[NodeRecord, dict[str, _Run]]] = {}

    def page(
        self,
        records: Sequence[tuple[str, NodeRecord]],
        namespace: str,
        accepts: Callable[[Entry], bool],
        cursor: Any,
        descending: bool,
        limit: int | None,
    ) -> tuple[list[Located], Any]:
        """Up to ``limit`` entries of the fresh ``records`` after ``cursor`` in order, and
        the cursor of the next page (None on the last one). ``limit`` None answers every
        match."""
        streams = []
        with self._lock:
            fresh = {node for node, _ in records}
            for gone in set(self._nodes) - fresh:
                del self._nodes[gone]
            for node, record in records:
                run = self._run(node, record, namespace)
                if run.keys:
                    streams.append(_tagged(run.after(cursor, descending), node))
        merged = heapq.merge(*streams, key=_first, reverse=descending)
        matches = (item for item in merged if accepts(item[2]))
        if limit is None:
            return [Located(node, entry) for _, node, entry in matches], None
        taken = list(itertools.islice(matches, limit + 1))
        page = taken[:limit]
        following = page[-1][0] if len(taken) > limit else None
        return [Located(node, entry) for _, node, entry in page], following

    def _run(self, node: str, record: NodeRecord, namespace: str) -> _Run:
        cached = self._nodes.get(node)
        if cached is None or cached[0] is not record:
            cached = (record, {})
            self._nodes[node] = cached
        runs = cached[1]
        run = runs.get(namespace)
        if run is None:
            entries = record.inventory.entries
            run = _Run((e for e in entries if e.namespaced_name[0] == namespace), self._key)
            runs[namespace] = run
        return run


def _tagged(items: Iterator[tuple[Any, Entry]], node: str) -> Iterator[tuple[Any, str, Entry]]:
    for key, entry in items:
        yield key, node, entry


def _first(item: tuple[Any, str, Entry]) -> Any:
    return item[0]

"""Read-your-writes: the writes this server made that the inventories do not show yet.

A claim, release, renew, pause or resume answered by a node is recorded here at once, as
the entry the node now holds under that claim id (None once released). Every read of
this server sees a node's inventory with its pending writes applied, so a sandbox is
listed, watched and found the moment its create returns, and gone the moment its delete
does, however short it lives, without waiting for the node's next publish.

A pending write ends when the node's inventory catches up:

* a record published after the write shows exactly the entry written (or no row, for a
  release): confirmed;
* two records published after the write do not: the node disagrees, and the node is
  right (a sandbox that died at once, a renew another replica overrode). Two, because a
  read that was in flight when the write was answered may not show it;
* ``bound`` passes (for a node that does not republish, or publishes the same record).

The first record that counts is one that replaced the record current when the write was
answered. A write through another replica is not here: it shows with the node's next
publish (one mesh poll, or one publish interval on Kubernetes).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from sandboxctl.core.model import Entry
from sandboxctl.core.snapshot import NodeRecord

MISSES_TO_DROP = 2


@dataclass(slots=True)
class _Pending:
    entry: Entry | None  # None: released
    before: NodeRecord | None  # the node's record when the write was answered
    expires: float  # monotonic
    checked: NodeRecord | None = None  # the last record compared with the write
    misses: int = 0


class PendingWrites:
    """Thread-safe. ``version`` changes whenever what ``apply`` returns may change."""

    def __init__(self, bound: timedelta) -> None:
        self._bound = bound.total_seconds()
        self._lock = threading.Lock()
        self._pending: dict[str, dict[str, _Pending]] = {}  # node -> claim id -> write
        self._applied: dict[str, tuple[NodeRecord, int, NodeRecord]] = {}
        self._node_versions: dict[str, int] = {}
        self.version = 0

    def __len__(self) -> int:
        return sum(len(writes) for writes in self._pending.values())

    def wrote(
        self,
        node: str,
        claim_id: str,
        entry: Entry | None,
        record: NodeRecord | None,
        monotonic: float,
    ) -> None:
        """Record that ``node`` now holds ``entry`` under ``claim_id`` (None: released);
        ``record`` is the node's record as this server holds it now."""
        with self._lock:
            writes = self._pending.setdefault(node, {})
            writes[claim_id] = _Pending(entry, record, monotonic + self._bound)
            self._bump(node)

    def nodes(self) -> set[str]:
        """The nodes with a pending write."""
        with self._lock:
            return set(self._pending)

    def find(self, claim_id: str) -> tuple[str, Entry | None] | None:
        """The node and entry of a pending write to ``claim_id`` (None: released)."""
        with self._lock:
            for node, writes in self._pending.items():
                pending = writes.get(claim_id)
                if pending is not None:
                    return node, pending.entry
            return None

    def settle(self, record_of: Callable[[str], NodeRecord | None], monotonic: float) -> None:
        """End the writes that the nodes' current records (fresh or not) confirm or
        refute, and those past their bound."""
        with self._lock:
            for node in list(self._pending):
                writes = self._pending[node]
                record = record_of(node)
                ended = [
                    claim_id
                    for claim_id, pending in writes.items()
                    if _ended(pending, claim_id, record, monotonic)
                ]
                for claim_id in ended:
                    del writes[claim_id]
                if ended:
                    self._bump(node)
                if not writes:
                    del self._pending[node]

    def apply(self, node: str, record: NodeRecord) -> NodeRecord:
        """``record`` with this node's pending writes applied: the same object when none
        is pending, and the same result object until the record or the writes change."""
        with self._lock:
            writes = self._pending.get(node)
            if not writes:
                return record
            version = self._node_versions[node]
            cached = self._applied.get(node)
            if cached is not None and cached[0] is record and cached[1] == version:
                return cached[2]
            written = [p.entry for p in writes.values() if p.entry is not None]
            kept = [e for e in record.inventory.entries if e.id not in writes]
            entries = sorted((*kept, *written), key=lambda e: (e.name, e.id))
            inventory = dataclasses.replace(record.inventory, entries=tuple(entries))
            applied = NodeRecord(inventory)
            self._applied[node] = (record, version, applied)
            return applied

    def _bump(self, node: str) -> None:
        self.version += 1
        self._node_versions[node] = self._node_versions.get(node, 0) + 1
        self._applied.pop(node, None)


def _ended(pending: _Pending, claim_id: str, record: NodeRecord | None, monotonic: float) -> bool:
    if monotonic >= pending.expires:
        return True
    if record is None or record is pending.before or record is pending.checked:
        return False
    pending.checked = record
    if record.by_id.get(claim_id) == pending.entry:  # None == None: a release confirmed
        return True
    pending.misses += 1
    return pending.misses >= MISSES_TO_DROP

"""What ``sandboxctl inventory`` reports about each node, as plain values."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sandboxctl.core.freshness import NodeState
from sandboxctl.core.snapshot import FleetView


@dataclass(frozen=True, slots=True)
class NodeRow:
    node: str
    address: str
    published_at: datetime | None
    age: timedelta | None  # behind the reference, less stall credit; negative when ahead
    state: NodeState
    sandboxes: int
    warm: int


def node_rows(view: FleetView) -> list[NodeRow]:
    """One row per node, stale ones included, in name order."""
    rows = []
    for node in view.snapshot.nodes:
        record = view.snapshot.record(node)
        assert record is not None  # every listed node has a record
        inventory = record.inventory
        stamp = inventory.published_at
        rows.append(
            NodeRow(
                node=node,
                address=inventory.address,
                published_at=stamp,
                age=view.age(node),
                state=view.state(node),
                sandboxes=len(inventory.entries),
                warm=sum(pool.warm for pool in inventory.pools),
            )
        )
    return rows


def count_states(rows: list[NodeRow]) -> dict[str, int]:
    counts = {state.value: 0 for state in NodeState}
    for row in rows:
        counts[row.state.value] += 1
    return counts

"""Small NodeInventory builders for store tests."""

from __future__ import annotations

from datetime import UTC, datetime

from sandboxctl.core.model import Entry, NodeInventory, Pool, PoolKey

T0 = datetime(2026, 11, 30, 4, 0, tzinfo=UTC)


def node(name: str, *entries: Entry, stamp: datetime = T0) -> NodeInventory:
    """A node with two warm base sandboxes; entries stay in the order given (publish order)."""
    return NodeInventory(
        node=name,
        address=f"{name}.fleet.test:7777",
        pools=(Pool(PoolKey("base"), warm=2, target=2),),
        entries=entries,
        published_at=stamp,
    )


def entry(name: str, phase: str = "Running", claim_id: str | None = None) -> Entry:
    return Entry(
        name=name,
        phase=phase,
        id=claim_id or f"sb_{name.replace('/', '_')}",
        template="base",
        claim_ref=name,
        claimed_at=T0,
    )

"""Small builders for the core tests: a fixed clock origin and terse inventories."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import settings

from sandboxctl.core.model import Entry, NodeInventory, Pool, PoolKey

# Every test reads time from here; nothing reads the machine's clock.
T0 = datetime(2026, 9, 27, 9, 0, tzinfo=UTC)

# Hypothesis without an on-disk example database, so a run leaves nothing behind.
quick = settings(database=None, deadline=None)


def sec(n: float) -> timedelta:
    return timedelta(seconds=n)


def at(offset_seconds: float) -> datetime:
    return T0 + sec(offset_seconds)


def entry(name: str, claim_id: str = "", phase: str = "Running") -> Entry:
    return Entry(name=name, phase=phase, id=claim_id)


def pool(template: str, warm: int, target: int = 4, net: str = "", size: str = "") -> Pool:
    return Pool(key=PoolKey.of(template, net, size), warm=warm, target=target)


def inv(
    node: str,
    stamp: datetime | None = None,
    *,
    address: str = "",
    pools: tuple[Pool, ...] = (),
    entries: tuple[Entry, ...] = (),
) -> NodeInventory:
    return NodeInventory(
        node=node, address=address, pools=pools, entries=entries, published_at=stamp
    )

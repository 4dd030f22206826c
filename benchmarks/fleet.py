"""A generated bench fleet: deterministic NodeInventory values around a fixed ``now``.

Node ``n`` is ``node-NNN`` at ``node-NNN.fleet.test:7777`` with one pool
(``ghcr.io/cocoonstack/sandbox/rt:24.04``, net none, size small, warm 5, target 5). Its
entry ``i`` is ``default/sb-node-NNN-i`` with claim id ``sb_node-NNN_i``; the first few
entries of every node carry metadata JSON. Fresh nodes publish within the last 30 s of
:data:`FLEET_NOW`; stale ones (``stale_fraction``) five minutes earlier than that.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
from datetime import UTC, datetime, timedelta

import msgspec

from sandboxctl.core.model import NO_METADATA, Entry, Metadata, NodeInventory, Pool, PoolKey

FLEET_NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
POOL_KEY = PoolKey("ghcr.io/cocoonstack/sandbox/rt:24.04", "none", "small")
PUBLISH_WINDOW = timedelta(seconds=30)
STALE_AGE = timedelta(minutes=5)
PORT = 7777


def node_name(n: int) -> str:
    return f"node-{n:03d}"


def node_index(node: str) -> int:
    return int(node.removeprefix("node-"))


def entry_name(n: int, i: int) -> str:
    return f"default/sb-node-{n:03d}-{i}"


def claim_id(n: int, i: int) -> str:
    return f"sb_node-{n:03d}_{i}"


@functools.cache
def _at(now: datetime, seconds: int) -> datetime:
    # Shared datetimes keep a 400k-entry fleet's memory down; values are what matter here.
    return now + timedelta(seconds=seconds)


def make_entry(
    n: int, i: int, *, now: datetime = FLEET_NOW, metadata: bool = False, generation: int = 0
) -> Entry:
    """Entry ``i`` of node ``n``; ``generation`` shifts its deadline as a republish would."""
    return Entry(
        name=entry_name(n, i),
        phase="Paused" if i % 7 == 6 else "Running",
        id=claim_id(n, i),
        template=POOL_KEY.template,
        claim_ref=f"default/claim-node-{n:03d}-{i}",
        addr=f"10.{n % 256}.{(i // 250) % 256}.{i % 250 + 2}:49983",
        deadline=_at(now, 600 + (i * 37 + generation * 300) % 3000),
        claimed_at=_at(now, -((i * 53) % 3600) - 60),
        metadata=(
            Metadata.parse(
                json.dumps(
                    {"job": f"job-{n:03d}-{i}", "owner": "bench", "tier": "ci"}, sort_keys=True
                )
            )
            if metadata
            else NO_METADATA
        ),
        cpu_count=2,
        memory_bytes=512 * 1024 * 1024,
    )


def stale_nodes(nodes: int, stale_fraction: float) -> frozenset[int]:
    """Indexes of the stale nodes: ``round(nodes * stale_fraction)`` of them, spread evenly."""
    count = round(nodes * stale_fraction)
    return frozenset(int((j + 0.5) * nodes / count) for j in range(count)) if count else frozenset()


def generate_fleet(
    nodes: int,
    entries_per_node: int,
    *,
    now: datetime = FLEET_NOW,
    stale_fraction: float = 0.0,
    metadata_per_node: int = 3,
    seed: int = 0,
) -> list[NodeInventory]:
    """``nodes`` inventories of ``entries_per_node`` entries each, in node-name order.

    Every fresh ``publishedAt`` lies strictly inside the last 30 s before ``now``, so a
    republish stamped ``now`` is the fleet's newest.
    """
    rng = random.Random(seed)
    stale = stale_nodes(nodes, stale_fraction)
    fleet = []
    for n in range(nodes):
        age = timedelta(microseconds=rng.randrange(1_000_000, 30_000_000))
        if n in stale:
            age += STALE_AGE
        fleet.append(
            NodeInventory(
                node=node_name(n),
                address=f"{node_name(n)}.fleet.test:{PORT}",
                pools=(Pool(POOL_KEY, warm=5, target=5),),
                entries=tuple(
                    make_entry(n, i, now=now, metadata=i < metadata_per_node)
                    for i in range(entries_per_node)
                ),
                published_at=now - age,
            )
        )
    return fleet


def republish(
    inventory: NodeInventory,
    *,
    changed: float = 0.1,
    renamed: float = 0.1,
    all_new: bool = False,
    published_at: datetime = FLEET_NOW,
    generation: int = 1,
) -> NodeInventory:
    """The node's next publish.

    Typical: ``changed`` of the entries keep their name with a new deadline and phase,
    ``renamed`` are replaced by entries under new names (claims ended, new ones began),
    the rest are unchanged. ``all_new``: every entry has a new name (worst case).
    """
    n = node_index(inventory.node)
    size = len(inventory.entries)
    change_every = round(1 / changed) if changed else 0
    rename_every = round(1 / renamed) if renamed else 0
    entries = []
    for i, entry in enumerate(inventory.entries):
        if all_new or (rename_every and i % rename_every == rename_every - 1):
            entries.append(make_entry(n, i + size * generation, generation=generation))
        elif change_every and i % change_every == 0:
            assert entry.deadline is not None
            entries.append(
                msgspec.structs.replace(
                    entry,
                    phase="Paused" if entry.phase == "Running" else "Running",
                    deadline=entry.deadline + timedelta(minutes=5),
                )
            )
        else:
            entries.append(entry)
    return dataclasses.replace(inventory, entries=tuple(entries), published_at=published_at)

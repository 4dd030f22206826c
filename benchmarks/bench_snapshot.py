"""FleetSnapshot and FleetView over generated fleets of 26x100, 26x2000 and 200x2000.

Cases per fleet shape (nodes x entries per node, ~10% of nodes stale); ``items`` is how
many entries (or candidates) the case handles:

- ``build``: ``FleetSnapshot.build`` over the whole fleet (it pauses the cyclic
  collector itself);
- ``replace typical``: one node's republish (10% of entries with a new deadline and
  phase, 10% replaced by new names) put into the built snapshot; ``replace all-new``:
  every name new (worst case);
- ``view()``: ``snapshot.view(rule, now)`` itself;
- ``lookup_name`` / ``lookup_claim_id``: 1000 random entries of fresh nodes looked up
  per timed run; the figures are per lookup (p50/p99 over runs);
- ``warm_candidates``: the one pool key every node offers;
- ``entries(), N stale``: ``view.entries()`` iterated to the end, stale nodes skipped;
- ``lookup_name naive/index``: the index against scanning every fresh node's entries,
  measured back to back; ``ratio`` = naive p50 / index p50.

Last, ``... flatness`` rows divide the lookup p50 on the largest fleet by the smallest's.
"""

from __future__ import annotations

import collections
import functools
import gc
import itertools
import random
from collections.abc import Iterator

from benchmarks import Row, with_target
from benchmarks.fleet import (
    FLEET_NOW,
    POOL_KEY,
    claim_id,
    generate_fleet,
    node_name,
    republish,
    stale_nodes,
)
from benchmarks.timing import gc_paused, measure
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.model import DEFAULT_NAMESPACE, NodeInventory
from sandboxctl.core.snapshot import FleetSnapshot, FleetView, Located

NAME = "snapshot"
SHAPES = ((26, 100), (26, 2000), (200, 2000))
STALE_FRACTION = 0.1
RULE = FreshnessRule().validate()
LOOKUP_KEYS = 1000  # distinct keys cycled through per timed run

REPLACE_TARGET_MS = 10.0  # typical one-node replace at 2000 entries
LOOKUP_TARGET_US = 5.0
WARM_TARGET_US = 500.0  # at 200x2000
FLATNESS_TARGET = 2.0  # largest / smallest fleet lookup p50


def run() -> Iterator[Row]:
    lookup_p50: dict[str, dict[str, float]] = {"lookup_name": {}, "lookup_claim_id": {}}
    for nodes, per_node in SHAPES:
        shape = f"{nodes}x{per_node}"
        for row in _bench_shape(nodes, per_node):
            if row["case"] in lookup_p50:
                lookup_p50[row["case"]][shape] = row["p50_us"]
            yield row
        gc.collect()
    small, large = (f"{n}x{e}" for n, e in (SHAPES[0], SHAPES[-1]))
    for case, p50 in lookup_p50.items():
        ratio = p50[large] / p50[small]
        yield with_target(
            _row(f"{case} flatness", f"{large}/{small}", ratio=round(ratio, 2)),
            ratio <= FLATNESS_TARGET,
            f"<= {FLATNESS_TARGET:g}x",
        )


def _bench_shape(nodes: int, per_node: int) -> Iterator[Row]:
    shape = f"{nodes}x{per_node}"
    with gc_paused():  # setup, not measured
        fleet = generate_fleet(nodes, per_node, stale_fraction=STALE_FRACTION)
    stale = stale_nodes(nodes, STALE_FRACTION)
    fresh = [n for n in range(nodes) if n not in stale]
    big = per_node >= 2000
    huge = nodes * per_node >= 100_000

    # 1. build; the last build is the snapshot every later case reads
    built: list[FleetSnapshot] = [FleetSnapshot.empty()]

    def build() -> None:
        built[0] = FleetSnapshot.build(fleet, seen_at=0.0)

    timing = measure(build, runs=20, warmup=0, max_seconds=1.0, min_runs=1 if huge else 3)
    yield _row("build", shape, **timing.figures("ms"), items=nodes * per_node)
    snapshot = built[0]

    # 2. replace one node with its next publish
    replaced = fleet[1]
    for case, republished in (
        ("replace typical", republish(replaced)),
        ("replace all-new", republish(replaced, all_new=True)),
    ):
        _check_replace(snapshot, republished)
        timing = measure(
            functools.partial(snapshot.replace, republished, seen_at=1.0),
            runs=200,
            max_seconds=1.5,
        )
        row = _row(case, shape, **timing.figures("ms"), items=per_node)
        if case == "replace typical" and big:
            with_target(
                row,
                timing.percentile(50) / 1e6 <= REPLACE_TARGET_MS,
                f"<= {REPLACE_TARGET_MS:g} ms",
            )
        yield row

    # 3. view creation, then lookups through one view
    def views() -> None:
        view = snapshot.view
        for _ in range(1000):
            view(RULE, FLEET_NOW)

    timing = measure(views, runs=200, ops=1000, max_seconds=0.5)
    yield _row("view()", shape, **timing.figures("us"))
    view = snapshot.view(RULE, FLEET_NOW)
    assert sorted(view.fresh_nodes()) == [node_name(n) for n in fresh]

    rng = random.Random(1)
    picks = [(rng.choice(fresh), rng.randrange(per_node)) for _ in range(LOOKUP_KEYS)]
    names = [(DEFAULT_NAMESPACE, f"sb-node-{n:03d}-{i}") for n, i in picks]
    ids = [claim_id(n, i) for n, i in picks]
    assert all(len(view.lookup_name(*key)) == 1 for key in names)
    assert all(view.lookup_claim_id(cid) is not None for cid in ids)

    def lookup_names() -> None:
        lookup = view.lookup_name
        for namespace, name in names:
            lookup(namespace, name)

    def lookup_ids() -> None:
        lookup = view.lookup_claim_id
        for cid in ids:
            lookup(cid)

    for case, fn in (("lookup_name", lookup_names), ("lookup_claim_id", lookup_ids)):
        timing = measure(fn, runs=200, ops=LOOKUP_KEYS, max_seconds=1.0)
        yield with_target(
            _row(case, shape, **timing.figures("us")),
            timing.percentile(50) / 1e3 <= LOOKUP_TARGET_US,
            f"<= {LOOKUP_TARGET_US:g} µs",
        )

    # 4. warm candidates for the pool every node offers
    assert len(view.warm_candidates(POOL_KEY)) == len(fresh)
    timing = measure(lambda: view.warm_candidates(POOL_KEY), runs=200, ops=10, max_seconds=0.5)
    yield with_target(
        _row("warm_candidates", shape, **timing.figures("us"), items=len(fresh)),
        timing.percentile(50) / 1e3 <= WARM_TARGET_US,
        f"<= {WARM_TARGET_US:g} µs",
    )

    # 5. list everything with staleness applied
    listed = sum(1 for _ in view.entries())
    assert listed == len(fresh) * per_node
    timing = measure(
        lambda: collections.deque(view.entries(), maxlen=0),
        runs=50,
        max_seconds=2.0 if big else 0.5,
    )
    yield _row(f"entries(), {len(stale)} stale", shape, **timing.figures("ms"), items=listed)

    # 6. the index against a naive scan, back to back
    index = measure(lookup_names, runs=100, ops=LOOKUP_KEYS, max_seconds=0.5)
    keys = itertools.cycle(names)
    assert all(_naive_lookup_name(view, *key) == view.lookup_name(*key) for key in names[:3])
    naive = measure(
        lambda: _naive_lookup_name(view, *next(keys)),
        runs=200,
        max_seconds=1.0 if big else 0.3,
    )
    yield _row(
        "lookup_name naive/index",
        shape,
        naive_p50_us=naive.figures("us")["p50_us"],
        index_p50_us=index.figures("us")["p50_us"],
        ratio=round(naive.percentile(50) / index.percentile(50)),
        runs=len(naive.samples_ns),
    )


def _naive_lookup_name(view: FleetView, namespace: str, name: str) -> list[Located]:
    """What a store without the name index does: scan every fresh node's entries.

    Plain string comparisons (no per-entry parsing), so this is a lower bound on a naive
    store's cost; a name without a slash lives in the default namespace, as in the index.
    """
    full = f"{namespace}/{name}"
    bare = name if namespace == DEFAULT_NAMESPACE else None
    found = []
    for node in view.fresh_nodes():
        inventory = view.inventory(node)
        assert inventory is not None
        for entry in inventory.entries:
            if entry.name == full or entry.name == bare:
                found.append(Located(node, entry))
                break  # the index answers with the first entry of a name on each node
    return found


def _check_replace(snapshot: FleetSnapshot, republished: NodeInventory) -> None:
    """The replaced snapshot answers with the new entries and forgets the dropped ones."""
    old = snapshot.record(republished.node)
    assert old is not None
    view = snapshot.replace(republished, seen_at=1.0).view(RULE, FLEET_NOW)
    new_names = {e.name for e in republished.entries}
    for entry in republished.entries[:50]:
        assert view.lookup_name(*entry.namespaced_name)[0].entry == entry
    for entry in old.inventory.entries[:50]:
        if entry.name not in new_names:
            assert view.lookup_name(*entry.namespaced_name) == []


def _row(case: str, fleet: str, **figures: object) -> Row:
    return {"benchmark": NAME, "case": case, "fleet": fleet, **figures}

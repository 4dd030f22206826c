"""The old build's side of ``bench_store``, and the procedures both sides time alike.

``bench_store`` extracts commit :data:`OLD_COMMIT`'s ``sandboxctl`` and ``benchmarks`` trees
into a temporary directory, copies this file into its ``benchmarks/`` and runs ``python -m
benchmarks.store_baseline`` there (the same interpreter, that directory first on
``sys.path``), so the old build is measured in the same run as the new one, over the same
generated fleet (``benchmarks.fleet.generate_fleet`` is deterministic: a seeded RNG and
fixed field values, the same module in both trees).

The old process builds its store (``NODES x PER_NODE``, the uncached store: ``store.list``
builds every object per call, about 35 µs each, most of it a pure-Python FNV-1a of its
resourceVersion), prints ``{"ready": ...}``, then answers one JSON line per command read
from stdin, so that the parent can interleave the two builds' rounds of one figure (on a
shared machine, load comes and goes; both sides see the same share of it):

- ``full_list``: ``store.list(Query.parse(None))`` once over a store of the fleet's first
  :data:`LIST_NODES` nodes (26x2000, 52,000 objects; wall and CPU time): the uncached list
  costs the same per object at any size (a 200x2000 run takes ~20 s on an idle machine and
  minutes on a busy one), so the parent scales it to 400,000 objects;
- ``pinned_tick``: ``Watcher(store, Query.parse("default", fields="metadata.name=<x>"))``
  opened once (at start), then idle ``tick()`` (it reads the holding node's record and
  builds its object every tick);
- ``lookup_name`` / ``lookup_claim_id``: ``FleetView.lookup_name`` / ``lookup_claim_id``
  over :func:`lookup_picks` (1000 entries, :data:`LOOKUP_CHUNK` a timed run), per lookup;
- ``locate`` / ``locate_claim``: ``store.locate`` / ``store.locate_claim`` over the first
  :data:`LOCATE_KEYS` picks (:data:`LOCATE_CHUNK` a run), owning-node index warm;
- ``page_first`` / ``page_deep``: ``SortedIndex().page(store.view(), "default", Filters(),
  cursor, True, 100)`` (what ``GET /v2/sandboxes`` ran), the first page and the page
  :data:`DEEP_PAGES` pages in through the cursor (runs sorted at start).

Each answer is ``{"samples_ns": [...]}`` (per operation, sorted; ``full_list`` also has
``cpu_ns`` and ``items``). Only :func:`main` imports the old API; everything above it
works in both trees (the parent imports this module for the shared procedures).
"""

from __future__ import annotations

import gc
import itertools
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.timing import Timing, gc_paused

OLD_COMMIT = "1e2f666"
NODES, PER_NODE = 200, 2000
LIST_NODES = 26  # the old full list is timed over this many nodes and scaled per object
NAMESPACE = "default"
LOOKUP_KEYS = 1000
LOOKUP_CHUNK = 50  # lookups per timed run
LOCATE_KEYS = 100  # the first picks: the old indexed locate_claim scans the node, ~1 ms
LOCATE_CHUNK = 10
PAGE_LIMIT = 100
DEEP_PAGES = 50  # 5000 sandboxes in
ROUND_SECONDS = 0.2  # one side's share of one round of one figure

Page = Callable[[Any], tuple[list[Any], Any]]  # cursor -> (found, next cursor)
Procedure = Callable[[], Timing]


def pinned_name(nodes: int, per_node: int) -> str:
    """The sandbox the pinned watch follows: the last entry of the last node."""
    return f"sb-node-{nodes - 1:03d}-{per_node - 1}"


def lookup_picks(nodes: int, per_node: int) -> list[tuple[int, int]]:
    """(node, entry) of the 1000 entries both sides look up, in the same order."""
    rng = random.Random(1)
    return [(rng.randrange(nodes), rng.randrange(per_node)) for _ in range(LOOKUP_KEYS)]


def repeat(
    fn: Callable[[], object], *, runs: int, ops: int = 1, warmup: int = 1, min_runs: int = 5
) -> Timing:
    """``benchmarks.timing.measure`` for one round, without its ``gc.collect()``: a full
    collection over a 200x2000 heap (and the new build's ledger) takes seconds, and the
    rounds' few short-lived objects never reach the oldest generation. Stops after
    ROUND_SECONDS once it has ``min_runs`` runs. The same code in both trees."""
    for _ in range(warmup):
        fn()
    clock = time.perf_counter_ns
    deadline = clock() + ROUND_SECONDS * 1e9
    samples: list[float] = []
    for i in range(runs):
        start = clock()
        fn()
        end = clock()
        samples.append((end - start) / ops)
        if i + 1 >= min_runs and end > deadline:
            break
    samples.sort()
    return Timing(tuple(samples))


def time_each(call: Callable[[Any], object], keys: list[Any], chunk: int) -> Procedure:
    """Per call: each timed run calls ``chunk`` of the keys, the runs going through them
    in turn (every key at least once a round). Short runs, so that the p50 is of runs the
    scheduler did not interrupt: on a busy machine a run of 1000 lookups rarely is."""
    assert len(keys) % chunk == 0
    chunks = [keys[at : at + chunk] for at in range(0, len(keys), chunk)]

    def procedure() -> Timing:
        turn = itertools.cycle(chunks)

        def calls() -> None:
            for key in next(turn):
                call(key)

        return repeat(calls, runs=1_000_000, ops=chunk, warmup=0, min_runs=len(chunks))

    return procedure


def time_idle_tick(tick: Callable[[], list[Any]]) -> Procedure:
    """An idle watch tick: it must send nothing (the fleet does not change)."""

    def idle() -> None:
        if tick():
            raise AssertionError("an idle tick sent events")

    return lambda: repeat(idle, runs=5000, warmup=100)


def time_page(page: Page, cursor: Any) -> Procedure:
    def one() -> None:
        found, _ = page(cursor)
        assert len(found) == PAGE_LIMIT

    return lambda: repeat(one, runs=200, warmup=5)


def deep_cursor(page: Page) -> Any:
    """The cursor DEEP_PAGES pages in; the first page (untimed) sorts every node's run."""
    cursor = None
    for _ in range(DEEP_PAGES):
        found, cursor = page(cursor)
        assert len(found) == PAGE_LIMIT
        assert cursor is not None
    return cursor


def timed_once(fn: Callable[[], object]) -> dict[str, Any]:
    """One run of ``fn`` (collector on, after a collection): wall and CPU time in ns."""
    gc.collect()
    wall, cpu = time.perf_counter_ns(), time.process_time_ns()
    fn()
    return {
        "samples_ns": [time.perf_counter_ns() - wall],
        "cpu_ns": time.process_time_ns() - cpu,
    }


def main() -> None:
    """Serve the old build's figures (this file's tree must be the extracted old one)."""
    import sandboxctl
    from benchmarks.fleet import FLEET_NOW, claim_id, generate_fleet
    from sandboxctl.apiserver.e2b.paging import Filters, SortedIndex
    from sandboxctl.clock import ManualClock
    from sandboxctl.core.freshness import FreshnessRule
    from sandboxctl.inventory.memory import MemoryInventorySource
    from sandboxctl.store.store import Query, SandboxStore
    from sandboxctl.store.watch import Watcher

    here = Path(__file__).resolve().parent.parent
    if Path(sandboxctl.__file__).resolve().parent.parent != here:
        raise SystemExit(f"store_baseline: imported sandboxctl from {sandboxctl.__file__}")
    rule = FreshnessRule().validate()
    with gc_paused():
        clock = ManualClock(FLEET_NOW)
        fleet = generate_fleet(NODES, PER_NODE)
        source = MemoryInventorySource(fleet, clock)
    store = SandboxStore(source, rule, clock=clock)

    name = pinned_name(NODES, PER_NODE)
    pinned = Watcher(store, Query.parse(NAMESPACE, fields=f"metadata.name={name}"))
    assert [e.object["metadata"]["name"] for e in pinned.open()] == [name]

    picks = lookup_picks(NODES, PER_NODE)
    names = [(NAMESPACE, f"sb-node-{n:03d}-{i}") for n, i in picks]
    ids = [claim_id(n, i) for n, i in picks]
    view = store.view()
    few_names, few_ids = names[:LOCATE_KEYS], ids[:LOCATE_KEYS]
    assert all(store.locate(*key) is not None for key in few_names)  # warms the owner index
    assert all(store.locate_claim(cid) is not None for cid in few_ids)

    index = SortedIndex()
    filters = Filters()

    def page(cursor: Any) -> tuple[list[Any], Any]:
        return index.page(store.view(), NAMESPACE, filters, cursor, True, PAGE_LIMIT)

    deep = deep_cursor(page)

    def full_list() -> dict[str, Any]:
        # A store over the fleet's first LIST_NODES nodes, built for this run only.
        small = SandboxStore(MemoryInventorySource(fleet[:LIST_NODES], clock), rule, clock=clock)
        everything = Query.parse(None)
        listed: list[int] = []
        out = timed_once(lambda: listed.append(len(small.list(everything))))
        assert listed == [LIST_NODES * PER_NODE]
        return {**out, "items": listed[0]}

    procedures: dict[str, Procedure] = {
        "pinned_tick": time_idle_tick(pinned.tick),
        "lookup_name": time_each(lambda key: view.lookup_name(*key), names, LOOKUP_CHUNK),
        "lookup_claim_id": time_each(view.lookup_claim_id, ids, LOOKUP_CHUNK),
        "locate": time_each(lambda key: store.locate(*key), few_names, LOCATE_CHUNK),
        "locate_claim": time_each(store.locate_claim, few_ids, LOCATE_CHUNK),
        "page_first": time_page(page, None),
        "page_deep": time_page(page, deep),
    }
    gc.collect()  # once, after setup; the rounds do not collect
    _answer({"ready": True, "commit": OLD_COMMIT, "figures": [*procedures, "full_list"]})
    for line in sys.stdin:
        command = line.strip()
        if command == "quit":
            return
        if command == "full_list":
            _answer(full_list())
        elif command in procedures:
            _answer({"samples_ns": list(procedures[command]().samples_ns)})
        else:
            _answer({"error": f"unknown command {command!r}"})


def _answer(body: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(body) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

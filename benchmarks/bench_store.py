"""SandboxStore reads at 200x2000, before and after the ledger, measured in the same run.

The fleet is ``benchmarks.fleet.generate_fleet(200, 2000)`` (deterministic: a seeded RNG
and fixed field values; every node publishes within 30 s of ``FLEET_NOW``, well inside the
default 90 s rule) in a ``MemoryInventorySource`` read through a ``ManualClock`` stopped
at ``FLEET_NOW``; the store has no node access (``nodes=None``), so no read asks an agent.

**Before** (``old_p50``) is commit ``1e2f666``, the uncached store: ``git archive 1e2f666
sandboxctl benchmarks`` of the repository (``git rev-parse --show-toplevel``) is extracted
to a temporary directory, and ``benchmarks/store_baseline.py`` runs there in a subprocess
(the same interpreter, that tree first on ``sys.path``) over the same fleet, answering
one figure per request; see its docstring for what it times. Without git or the commit,
one row says the baseline is unavailable and the others show the new figures alone.
**After** (``p50``) is this tree, in this process. ``ratio`` is new / old; ``cpu`` and
``old_cpu`` are CPU time where a figure is one run (on a busy machine, steadier than wall).

- ``cold full list``: the first ``store.list(Query())`` (everything, all namespaces; the
  first read of any kind builds the ledger, so it comes first): the ledger builds the
  400,000 objects, the list sorts the names once and answers. One run;
- ``full list, warm ledger``: ``store.list(Query())`` again, p50. Target <= 2 s. Old:
  ``store.list(Query.parse(None))``, which builds every object per call, timed once over
  the fleet's first 26 nodes (52,000 objects) and scaled per object to 400,000 (a 200x2000
  run takes ~20 s on an idle machine and minutes on a busy one: scaled, it came within
  ~1% of a direct 200x2000 run in wall time and ~15% under it in CPU time); it is also
  the cold list's ``old_p50`` and ``old_cpu``;
- ``pinned watch tick, idle``: ``store.watch(Query.parse("default", fields="metadata.name=<x>"))``
  (the last entry of the last node) opened, then idle ``poll()`` (must send nothing).
  Old: ``Watcher(...).tick()`` on the same query;
- ``FleetView.lookup_name`` / ``lookup_claim_id``: the snapshot lookups of 1000 random
  fresh entries (``store_baseline.lookup_picks``, the same on both sides), 50 per timed
  run, per lookup; ``store.locate`` / ``store.locate_claim``: the first 100 of them
  through the store, 10 a run, per lookup (old: with its owning-node index warm), for
  information (no target);
- ``e2b page of 100``: ``store.page("default", paging.sort_key, Filters().accepts, cursor,
  True, 100)``, the first page and the page 5000 deep (the cursor 50 pages in); the runs
  are sorted by an untimed walk first. Old: ``SortedIndex().page(store.view(), ...)``;
- ``list after one node republished`` (last: it changes the fleet): before each timed
  ``store.list(Query())``, untimed, one node's inventory is replaced by
  ``benchmarks.fleet.republish`` of it (10% of the entries change phase and deadline, 10%
  are renamed: 600 changes), nodes taken in turn; ``store.stats.rescans`` must grow by
  exactly one per list (asserted; ``rescans``). Target p50 <= 5% of the cold full list's
  wall time (``vs_cold``; ``cpu`` against the cold list's ``cpu`` for the CPU share).

The pinned tick, the snapshot lookups and the pages target no regression: new p50 <= 1.1x
old p50. Each of those figures (and the store lookups) is timed in ``ROUNDS`` interleaved
rounds, old and new in turn (~0.2 s a side a round; ``store_baseline.repeat``, the same
code on both sides), and ``p50`` pools each side's samples: load on a shared machine
comes and goes, and both sides see the same share of it. The rounds run no full
collection (each side collects once before them: over these heaps it takes seconds).

Last, ``event log memory``: twice, under tracemalloc from the start, a separate 2x2000
fleet, its source and a store are built, the store syncs (the cold build), then nodes are
republished in turn (600 changes each) with a sync after each until >= 10,000 changes
were logged; the bytes still allocated at the end are counted. Once with the default
``retain`` (10,000: the log holds every change, fewer than 20,000, so none trimmed), once
with ``retain=1``; everything else is the same, so the difference is what the log
retains (the changes, and the objects and entries only the log still holds). An untraced
dry run first fills ``benchmarks.fleet``'s cache of shared datetimes, so neither traced
run allocates it. Reported in KB per 10,000 events (``events``: how many were logged);
what an event holds does not depend on the fleet's size (4x2000 and 8x2000 measured the
same within 1%).

Timed blocks keep the cyclic collector on, as in production; setup runs with it paused.
The two processes' setups overlap; their timed parts never do. Whole run: about two
minutes on this 2-core machine, most of it the cold ledger (~40 s CPU, some 60% of it the
cyclic collector scanning the growing heap) and building the fleets.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks import Row, oldtree, with_target
from benchmarks.fleet import FLEET_NOW, claim_id, generate_fleet, node_name, republish
from benchmarks.store_baseline import (
    DEEP_PAGES,
    LIST_NODES,
    LOCATE_CHUNK,
    LOCATE_KEYS,
    LOOKUP_CHUNK,
    NAMESPACE,
    NODES,
    OLD_COMMIT,
    PAGE_LIMIT,
    PER_NODE,
    Procedure,
    deep_cursor,
    lookup_picks,
    pinned_name,
    time_each,
    time_idle_tick,
    time_page,
    timed_once,
)
from benchmarks.timing import Timing, gc_paused, measure
from sandboxctl.apiserver.e2b.paging import Filters, sort_key
from sandboxctl.clock import ManualClock
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.ids import SandboxId
from sandboxctl.inventory.memory import MemoryInventorySource
from sandboxctl.store import Query, SandboxStore
from sandboxctl.store.ledger import DEFAULT_RETAIN

NAME = "store"
SHAPE = f"{NODES}x{PER_NODE}"
RULE = FreshnessRule().validate()
ANSWER_SECONDS = 600.0  # the longest the old build may take to answer (its setup, mostly)
ROUNDS = 8

FULL_LIST_TARGET_S = 2.0
REPUBLISHED_TARGET = 0.05  # of a cold full list
REGRESSION_TARGET = 1.1  # new p50 / old p50
REPUBLISH_RUNS, REPUBLISH_SECONDS = 8, 4.0  # at least 3 runs

LOG_NODES = 2  # the event-log fleet: LOG_NODES x PER_NODE
LOG_EVENTS = 10_000


def run() -> Iterator[Row]:
    with _old_build() as old:
        yield from _bench(old)
    if old.why:
        yield _row(f"baseline (commit {OLD_COMMIT})", SHAPE, note=f"unavailable: {old.why}")
    yield _log_memory()


# --- the old build, in a subprocess ------------------------------------------------------


class _OldBuild:
    """The old build's process: ``ask(figure)`` answers its samples, or None (``why``)."""

    def __init__(self) -> None:
        self.why = ""
        self._process: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str] = queue.Queue()

    def start(self, tree: Path) -> None:
        """Extract the old trees into ``tree`` and start the old build there (it sets up
        while this process does)."""
        here = Path(__file__).resolve().parent
        why = oldtree.extract(OLD_COMMIT, tree, ("sandboxctl", "benchmarks"))
        if why is not None:
            self.why = why
            return
        shutil.copy(here / "store_baseline.py", tree / "benchmarks")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        self._process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.store_baseline"],
            cwd=tree,  # first on sys.path with -m: the old sandboxctl and benchmarks
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._read, args=(self._process,), daemon=True).start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self._lines.put(line)
        self._lines.put("")  # it exited

    def ready(self) -> None:
        """Wait until the old build has set up (or failed to)."""
        if self._process is not None:
            answer = self._answer()
            if answer is not None and not answer.get("ready"):
                self._fail(f"it did not start: {answer}")

    def ask(self, figure: str) -> dict[str, Any] | None:
        if self._process is None:
            return None
        assert self._process.stdin is not None
        try:
            self._process.stdin.write(figure + "\n")
            self._process.stdin.flush()
        except OSError as error:
            self._fail(f"it went away ({error})")
            return None
        answer = self._answer()
        if answer is not None and "samples_ns" not in answer:
            self._fail(f"{figure}: {answer}")
            return None
        return answer

    def _answer(self) -> dict[str, Any] | None:
        try:
            line = self._lines.get(timeout=ANSWER_SECONDS)
        except queue.Empty:
            self._fail(f"no answer in {ANSWER_SECONDS:g} s")
            return None
        if not line:
            assert self._process is not None
            self._fail(f"it exited ({self._process.wait()}; see stderr)")
            return None
        answer: dict[str, Any] = json.loads(line)
        return answer

    def _fail(self, why: str) -> None:
        self.why = f"the old build's run failed: {why}"
        self.close()

    def close(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(OSError):
            assert process.stdin is not None
            process.stdin.write("quit\n")
            process.stdin.close()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def _old_build() -> Iterator[_OldBuild]:
    old = _OldBuild()
    with tempfile.TemporaryDirectory(prefix="sandboxctl-bench-store-") as tree:
        try:
            old.start(Path(tree))
            yield old
        finally:
            old.close()


# --- both builds -------------------------------------------------------------------------


def _bench(old: _OldBuild) -> Iterator[Row]:
    with gc_paused():  # setup, not measured; the old build sets up meanwhile
        clock = ManualClock(FLEET_NOW)
        source = MemoryInventorySource(generate_fleet(NODES, PER_NODE), clock)
    store = SandboxStore(source, RULE, clock=clock)
    everything = Query()
    total = NODES * PER_NODE
    old.ready()

    # 1. the old list (this process idle), then the first read here builds the ledger
    old_list, old_list_cpu_ns = _scaled_old_list(old.ask("full_list"))
    listed: list[int] = []
    cold = timed_once(lambda: listed.append(len(store.list(everything).items)))
    assert listed == [total], listed
    assert store.stats.rescans == NODES
    (cold_ns,) = cold["samples_ns"]
    row = _versus(
        "cold full list (the ledger builds all)",
        Timing((cold_ns,)),
        old_list,
        "ms",
        cpu_ms=_round(cold["cpu_ns"] / 1e6),
    )
    if old_list is not None:
        row["old_cpu_ms"] = _round(old_list_cpu_ns / 1e6)
    yield row

    def listing() -> None:
        assert len(store.list(everything).items) == total

    warm = measure(listing, runs=5, warmup=0, max_seconds=3.0, min_runs=3)
    row = _versus("full list, warm ledger", warm, old_list, "ms")
    yield with_target(row, warm.p50_ns / 1e9 <= FULL_LIST_TARGET_S, "<= 2 s")
    gc.collect()  # once, before the rounds (which do not collect)

    # 2. the pinned watch, idle
    name = pinned_name(NODES, PER_NODE)
    watch = store.watch(Query.parse(NAMESPACE, fields=f"metadata.name={name}"))
    assert [e.object["metadata"]["name"] for e in watch.open()] == [name]
    yield _regression(
        old, "pinned_tick", time_idle_tick(watch.poll), "pinned watch tick, idle", "us"
    )

    # 3. snapshot lookups, then the store's
    picks = lookup_picks(NODES, PER_NODE)
    names = [(NAMESPACE, f"sb-node-{n:03d}-{i}") for n, i in picks]
    ids = [claim_id(n, i) for n, i in picks]
    view = source.snapshot().view(RULE, clock.now(), clock.monotonic())
    by_name = time_each(lambda key: view.lookup_name(*key), names, LOOKUP_CHUNK)
    yield _regression(old, "lookup_name", by_name, "FleetView.lookup_name", "us")
    by_id = time_each(view.lookup_claim_id, ids, LOOKUP_CHUNK)
    yield _regression(old, "lookup_claim_id", by_id, "FleetView.lookup_claim_id", "us")
    names = names[:LOCATE_KEYS]
    ids = [SandboxId.of_claim(cid) for cid in ids[:LOCATE_KEYS]]
    assert all(store.locate(*key) is not None for key in names)
    assert all(store.locate_claim(cid) is not None for cid in ids)
    for figure, procedure in (
        ("locate", time_each(lambda key: store.locate(*key), names, LOCATE_CHUNK)),
        ("locate_claim", time_each(store.locate_claim, ids, LOCATE_CHUNK)),
    ):
        new, before = _interleaved(old, figure, procedure)
        yield _versus(f"store.{figure} (information)", new, before, "us")

    # 4. e2b pages of 100
    accepts = Filters().accepts

    def page(cursor: Any) -> tuple[list[Any], Any]:
        found, following, _ = store.page(NAMESPACE, sort_key, accepts, cursor, True, PAGE_LIMIT)
        return found, following

    deep = deep_cursor(page)
    first_page = time_page(page, None)
    yield _regression(old, "page_first", first_page, "e2b page of 100, first", "ms")
    deep_page = time_page(page, deep)
    yield _regression(
        old, "page_deep", deep_page, f"e2b page of 100, {DEEP_PAGES * PAGE_LIMIT} deep", "ms"
    )
    old.close()  # its fleet is no longer needed

    # 5. last (it changes the fleet): lists after one node's republish
    yield _republished(store, source, everything, cold)


def _interleaved(old: _OldBuild, figure: str, new: Procedure) -> tuple[Timing, Timing | None]:
    """ROUNDS rounds of one figure, old and new in turn; each side's samples pooled."""
    mine: list[float] = []
    theirs: list[float] | None = []
    for round_ in range(ROUNDS):
        for side in ("old", "new") if round_ % 2 == 0 else ("new", "old"):
            if side == "new":
                mine.extend(new().samples_ns)
            elif theirs is not None:
                answer = old.ask(figure)
                theirs = None if answer is None else theirs + answer["samples_ns"]
    return Timing(tuple(sorted(mine))), Timing(tuple(sorted(theirs))) if theirs else None


def _republished(
    store: SandboxStore, source: MemoryInventorySource, query: Query, cold: dict[str, Any]
) -> Row:
    """Lists that each follow one node's republish (untimed, just before)."""
    walls: list[float] = []
    cpus: list[float] = []
    spent = 0.0
    gc.collect()
    for run in range(REPUBLISH_RUNS):
        record = source.snapshot().record(node_name(run % NODES))
        assert record is not None
        source.apply(republish(record.inventory, generation=1))
        rescans = store.stats.rescans
        wall, cpu = time.perf_counter_ns(), time.process_time_ns()
        page = store.list(query)
        walls.append(elapsed := time.perf_counter_ns() - wall)
        cpus.append(time.process_time_ns() - cpu)
        assert store.stats.rescans == rescans + 1, "a list after one republish rescanned more"
        assert len(page.items) == NODES * PER_NODE
        spent += elapsed
        if run + 1 >= 3 and spent > REPUBLISH_SECONDS * 1e9:
            break
    timing, cpu = Timing(tuple(sorted(walls))), Timing(tuple(sorted(cpus)))
    share = timing.p50_ns / cold["samples_ns"][0]
    row = _row(
        "list after one node republished",
        SHAPE,
        p50_ms=_round(timing.p50_ns / 1e6),
        cpu_ms=_round(cpu.p50_ns / 1e6),
        vs_cold=round(share, 4),
        rescans=1,
        runs=len(walls),
    )
    return with_target(row, share <= REPUBLISHED_TARGET, "<= 5 % of a cold full list")


# --- the event log's memory ----------------------------------------------------------------


def _log_memory() -> Row:
    _logged(None)  # untraced: fills benchmarks.fleet's cache of shared datetimes
    bare_bytes, bare_events, bare_kept = _logged(1)
    kept_bytes, events, kept = _logged(DEFAULT_RETAIN)
    assert bare_events == events, (bare_events, events)
    assert bare_kept <= 1
    assert kept == events < 2 * DEFAULT_RETAIN, "the log trimmed: the difference is not one log"
    per_10k = (kept_bytes - bare_bytes) / events * LOG_EVENTS / 1024
    return _row(
        "event log memory, per 10,000 events",
        f"{LOG_NODES}x{PER_NODE}",
        per_10k_kb=_round(per_10k),
        events=events,
    )


def _logged(retain: int | None) -> tuple[int, int, int]:
    """Build a LOG_NODES x PER_NODE fleet, source and store keeping ``retain`` changes
    (None: no store), then republish nodes in turn until LOG_EVENTS changes were logged.
    Returns the bytes tracemalloc still counts allocated at the end (everything alive:
    fleet, source, store), the changes logged and the changes the log retains."""
    gc.collect()
    tracemalloc.start()
    try:
        with gc_paused():
            base = tracemalloc.get_traced_memory()[0]
            clock = ManualClock(FLEET_NOW)
            current = {inv.node: inv for inv in generate_fleet(LOG_NODES, PER_NODE)}
            source = MemoryInventorySource(current.values(), clock)
            store = SandboxStore(source, RULE, clock=clock, retain=retain or 1)
            first = store.state().version if retain is not None else 0  # the cold build
            changes = generation = 0
            while changes < LOG_EVENTS:
                node = node_name(generation % LOG_NODES)
                generation += 1
                current[node] = republish(current[node], generation=generation)
                if retain is None:
                    changes += 3 * PER_NODE // 10  # 10% changed, 10% renamed (two changes)
                    continue
                source.apply(current[node])
                changes = store.state().version - first
            gc.collect()
            live = tracemalloc.get_traced_memory()[0] - base
            retained = store.retained_changes() if retain is not None else 0
    finally:
        tracemalloc.stop()
    return live, changes, retained


# --- rows --------------------------------------------------------------------------------


def _scaled_old_list(answer: dict[str, Any] | None) -> tuple[Timing | None, float]:
    """The old build's full list per object, scaled to the whole fleet: wall, CPU ns."""
    if answer is None:
        return None, 0.0
    assert answer["items"] == LIST_NODES * PER_NODE
    (wall,) = answer["samples_ns"]
    scale = NODES / LIST_NODES
    return Timing((wall * scale,)), answer["cpu_ns"] * scale


def _versus(case: str, new: Timing, old: Timing | None, unit: str, **extra: Any) -> Row:
    """New p50, old p50 and new / old."""
    scale = {"us": 1e3, "ms": 1e6}[unit]
    row = _row(case, SHAPE, **{f"p50_{unit}": _round(new.p50_ns / scale)})
    if old is not None:
        row[f"old_p50_{unit}"] = _round(old.p50_ns / scale)
        row["ratio"] = _ratio(new.p50_ns / old.p50_ns)
    row["runs"] = len(new.samples_ns)
    row.update(extra)
    return row


def _regression(old: _OldBuild, figure: str, new: Procedure, case: str, unit: str) -> Row:
    """A figure that must not regress: new p50 <= REGRESSION_TARGET x old p50."""
    mine, theirs = _interleaved(old, figure, new)
    row = _versus(case, mine, theirs, unit)
    if theirs is None:
        return row
    met = mine.p50_ns <= REGRESSION_TARGET * theirs.p50_ns
    return with_target(row, met, f"<= {REGRESSION_TARGET:g}x old")


def _ratio(value: float) -> float:
    return float(round(value)) if value >= 100 else round(value, 3 if value < 1 else 2)


def _round(value: float) -> float:
    return float(f"{value:.4g}")


def _row(case: str, fleet: str, **figures: object) -> Row:
    return {"benchmark": NAME, "case": case, "fleet": fleet, **figures}

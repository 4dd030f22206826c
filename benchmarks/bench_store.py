"""SandboxStore reads and watches over generated fleets of 26x100, 26x2000 and 200x2000.

Every fleet is built once (``benchmarks.fleet.generate_fleet``, no stale nodes: every
node publishes within 30 s of ``FLEET_NOW``, well inside the default 90 s rule) into a
``MemoryInventorySource`` read through a ``ManualClock`` stopped at ``FLEET_NOW``; the
store has no node access (``nodes=None``), so no read ever asks an agent.

1. Watch ticks per shape, following the last entry of the last node:

   - ``watch tick pinned``: ``Watcher(store, Query.parse("default",
     fields="metadata.name=<name>"))`` opened once, then idle ``tick()`` timed; it reads
     only the holding node's record (its ``by_name`` dict), then builds one Sandbox object;
   - ``watch tick fleet``: ``Watcher(store, Query.parse("default"))`` opened once (the
     opening burst, one full sweep, is setup), then idle ``tick()`` timed: it finds the
     snapshot object and the freshness cutoff it read last, so it lists no node, reads
     none (``store.stats`` unchanged, asserted) and builds no object; target <= 50 µs;
   - ``watch tick fleet/pinned``: the ratio of those two idle p50s (below 1: the idle
     fleet tick does less than the pinned one, which builds its object every tick);
   - ``watch tick fleet, one node republished``: before each timed tick (untimed), one
     node's inventory is replaced by ``benchmarks.fleet.republish`` of it (10% of the
     entries change phase and deadline, 10% are renamed), nodes taken in turn; the tick
     lists the fresh nodes, rescans that one node (one node read, asserted), builds an
     object only for the entries not equal to the ones it read before, and sends
     MODIFIED, ADDED and DELETED (``events`` per tick);
   - ``watch tick fleet, one node all new``: the same with ``all_new=True`` (every entry
     renamed): the rescan builds an object for each of the node's entries, the cost of
     one node of its size. Every republished inventory is put back afterwards;
   - ``watch tick pinned flatness``: pinned p50 at 200x2000 / 26x100; target <= 2x.

   Reference figures (upstream, as measured there): fleet/pinned ratios of 33x, 21x and
   147x on these three shapes, when an idle fleet tick swept every fresh entry into a
   Sandbox object and diffed them (~25 s at 200x2000); and a pinned tick that grew with
   one node's entries (it scanned the holding node's inventory); here the pinned tick
   reads a per-node dict and the fleet tick rescans only nodes whose record changed.

2. The store with its indexes on (``indexed=True``) against a second store over the same
   source with ``indexed=False``, measured back to back:

   - ``list phase=Running``, at 26x2000: ``Query.parse(None, labels="sandbox.cocoonstack.io/
     phase=Running")``, one run per store (each is a full sweep: ~20 s at 200x2000, so
     not run there). ``list()`` never consults the indexes (they serve lookups by name
     and claim id, not label selectors), so the ratio row is expected near 1x and its
     ``note`` says so;
   - ``get``, at 200x2000: ``store.get("default", name)`` for random names of the fleet;
     with the index it resolves through the owning-node index (warmed by the first pass)
     and the node's ``by_name`` dict; without, it scans ``view.entries("default")`` to
     the name.

Timed blocks keep the cyclic collector on, as in production; setup (fleet generation,
the fleet watch's opening burst, the republishes) runs with it paused or untimed. Whole
run: about a minute, dominated by the 200x2000 fleet watch's opening burst (~15 s: about
35 µs per Sandbox object, most of it the pure-Python FNV-1a of its resourceVersion).
"""

from __future__ import annotations

import gc
import itertools
import random
import time
from collections.abc import Callable, Iterator

from benchmarks import Row, with_target
from benchmarks.fleet import FLEET_NOW, generate_fleet, node_name, republish
from benchmarks.timing import Timing, gc_paused, measure
from sandboxctl.clock import ManualClock
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.model import DEFAULT_NAMESPACE, NodeInventory
from sandboxctl.inventory.memory import MemoryInventorySource
from sandboxctl.store.store import Query, SandboxStore
from sandboxctl.store.watch import Watcher

NAME = "store"
SHAPES = ((26, 100), (26, 2000), (200, 2000))
LIST_SHAPE = (26, 2000)  # a 200x2000 list takes ~20 s a run: the run would pass 2 minutes
RULE = FreshnessRule().validate()
LABELS = "sandbox.cocoonstack.io/phase=Running"
GET_KEYS = 1000  # distinct random names for the indexed get, cycled per timed run

PINNED_TARGET_US = 50.0
IDLE_FLEET_TARGET_US = 50.0  # an idle fleet tick reads no node, whatever the fleet's size
FLATNESS_TARGET = 2.0  # pinned p50, largest / smallest fleet
POLL_RATIO_TARGET = 1000.0  # fleet poll / pinned tick at 200x2000
NO_GAIN_BELOW = 1.25  # a disabled/enabled ratio under this is no gain
REPUBLISHES = (  # (case, benchmarks.fleet.republish's all_new)
    ("watch tick fleet, one node republished", False),
    ("watch tick fleet, one node all new", True),
)


def run() -> Iterator[Row]:
    pinned_p50_ns: dict[str, float] = {}
    lists: list[Row] = []  # measured at LIST_SHAPE, shown after the watch rows
    store: SandboxStore | None = None
    for nodes, per_node in SHAPES:
        store = None  # drop the previous fleet before building the next
        gc.collect()
        store = _store(nodes, per_node)
        for row, p50_ns in _bench_watch(store, nodes, per_node):
            if p50_ns is not None:
                pinned_p50_ns[row["fleet"]] = p50_ns
            yield row
        if (nodes, per_node) == LIST_SHAPE:
            lists.extend(_bench_list(store, nodes, per_node))
    small, large = (f"{n}x{e}" for n, e in (SHAPES[0], SHAPES[-1]))
    flatness = pinned_p50_ns[large] / pinned_p50_ns[small]
    yield with_target(
        _row("watch tick pinned flatness", f"{large}/{small}", ratio=round(flatness, 2)),
        flatness <= FLATNESS_TARGET,
        f"<= {FLATNESS_TARGET:g}x",
    )
    yield from lists
    assert store is not None
    yield from _bench_get(store, *SHAPES[-1])


def _store(nodes: int, per_node: int) -> SandboxStore:
    """The fleet in a memory source, read at FLEET_NOW; every node fresh."""
    with gc_paused():  # setup, not measured
        fleet = generate_fleet(nodes, per_node)
        clock = ManualClock(FLEET_NOW)
        source = MemoryInventorySource(fleet, clock)
    store = SandboxStore(source, RULE, clock=clock)
    assert store.view().fresh_nodes() == [node_name(n) for n in range(nodes)]
    return store


def _bench_watch(
    store: SandboxStore, nodes: int, per_node: int
) -> Iterator[tuple[Row, float | None]]:
    """Rows for one shape, each with the pinned p50 in ns where the row is the pinned tick."""
    shape = f"{nodes}x{per_node}"
    total = nodes * per_node
    big = per_node >= 2000
    name = f"sb-node-{nodes - 1:03d}-{per_node - 1}"  # the last entry of the last node

    # pinned first, while the heap holds no fleet watch
    pinned = Watcher(store, Query.parse(DEFAULT_NAMESPACE, fields=f"metadata.name={name}"))
    opened = pinned.open()
    assert [e.object["metadata"]["name"] for e in opened] == [name]
    sweeps = store.stats.fleet_reads
    pinned_timing = measure(_idle(pinned), runs=5000, warmup=100, max_seconds=1.0)
    assert store.stats.fleet_reads == sweeps, "an idle pinned tick swept the fleet"
    pinned_ns = pinned_timing.p50_ns
    yield (
        with_target(
            _row("watch tick pinned", shape, **pinned_timing.figures("us"), items=1),
            pinned_ns / 1e3 <= PINNED_TARGET_US,
            f"<= {PINNED_TARGET_US:g} µs",
        ),
        pinned_ns,
    )

    # The fleet poll a pinned watch replaces: sweep every inventory and build every object,
    # as a watch that re-lists the fleet each tick does (upstream's "fleet" arm).
    everyone = Query.parse(DEFAULT_NAMESPACE)
    poll_timing = measure(
        lambda: store.list(everyone),
        runs=5 if nodes * per_node < 100_000 else 1,
        warmup=0,
        max_seconds=1.0,
        min_runs=1,
    )
    yield (_row("fleet poll (full sweep)", shape, **poll_timing.figures("ms"), items=total), None)
    poll_ratio = poll_timing.p50_ns / pinned_ns
    ratio_row = _row(
        "fleet poll/pinned tick",
        shape,
        ratio=_ratio(poll_timing, pinned_timing),
        note="what one tick of a pinned watch costs against re-listing the fleet",
    )
    if (nodes, per_node) == (200, 2000):
        ratio_row = with_target(ratio_row, poll_ratio >= POLL_RATIO_TARGET, ">= 1000x")
    yield (ratio_row, None)

    fleet = Watcher(store, Query.parse(DEFAULT_NAMESPACE))
    with gc_paused():  # setup: the opening burst builds every entry's object
        assert len(fleet.open()) == total
    reads = (store.stats.fleet_reads, store.stats.node_reads)
    fleet_timing = measure(_idle(fleet), runs=5000, warmup=100, max_seconds=1.0)
    assert (store.stats.fleet_reads, store.stats.node_reads) == reads, "an idle tick read"
    fleet_ns = fleet_timing.p50_ns
    yield (
        with_target(
            _row("watch tick fleet", shape, **fleet_timing.figures("us"), items=total),
            fleet_ns / 1e3 <= IDLE_FLEET_TARGET_US,
            f"<= {IDLE_FLEET_TARGET_US:g} µs",
        ),
        None,
    )
    yield (
        _row(
            "watch tick fleet/pinned",
            shape,
            ratio=_ratio(fleet_timing, pinned_timing),
            note="idle ticks: fleet (same snapshot, no node read) / pinned (reads its "
            "node, builds one object)",
        ),
        None,
    )

    for case, all_new in REPUBLISHES:
        timing, events = _republished(store, fleet, nodes, big, all_new)
        yield (
            _row(case, shape, **timing.figures("ms"), items=per_node, events=events),
            None,
        )
    del fleet  # its 400k known objects would tax every later collection


def _republished(
    store: SandboxStore, fleet: Watcher, nodes: int, big: bool, all_new: bool
) -> tuple[Timing, int]:
    """Ticks that each find one node republished (untimed, just before): the tick lists
    the fresh nodes, rescans that one, and reports its changes. Nodes taken in turn; every
    inventory is put back afterwards, so later cases read the fleet as generated."""
    source = store.source
    assert isinstance(source, MemoryInventorySource)
    originals: dict[str, NodeInventory] = {}
    samples: list[float] = []
    events: set[int] = set()
    reads = store.stats.node_reads
    runs, max_ns = (30 if big else 200), 2e9
    gc.collect()
    spent = 0.0
    for run in range(runs):
        node = node_name(run % nodes)
        record = source.snapshot().record(node)
        assert record is not None
        originals.setdefault(node, record.inventory)
        source.apply(republish(record.inventory, all_new=all_new, generation=run + 1))
        start = time.perf_counter_ns()
        sent = fleet.tick()
        spent += (elapsed := time.perf_counter_ns() - start)
        samples.append(elapsed)
        events.add(len(sent))
        if run + 1 >= 5 and spent > max_ns:
            break
    assert store.stats.node_reads == reads + len(samples), "a tick read more than one node"
    with gc_paused():
        for inventory in originals.values():
            source.apply(inventory)
        assert fleet.tick()  # back as generated (and what the next case starts from)
    (count,) = events  # every republish of a size changes as many entries
    return Timing(tuple(sorted(samples))), count


def _bench_list(store: SandboxStore, nodes: int, per_node: int) -> Iterator[Row]:
    """A label-selected list with the indexes on against off, over the same source."""
    shape = f"{nodes}x{per_node}"
    enabled = store
    disabled = SandboxStore(store.source, RULE, clock=store.clock, indexed=False)

    # a fleet list with a label selector: one full sweep per run, one run each
    query = Query.parse(None, labels=LABELS)
    counts: dict[str, int] = {}
    timings: dict[str, Timing] = {}
    for label, each in (("on", enabled), ("off", disabled)):

        def listing(each: SandboxStore = each, label: str = label) -> None:
            counts[label] = len(each.list(query))

        timings[label] = measure(listing, runs=1, warmup=0, min_runs=1)
    assert counts["on"] == counts["off"] == sum(1 for i in range(per_node) if i % 7 != 6) * nodes
    for label in ("on", "off"):
        yield _row(
            f"list phase=Running, index {label}",
            shape,
            **timings[label].figures("ms"),
            items=counts[label],
        )
    ratio = _ratio(timings["off"], timings["on"])
    note = (
        "no gain: list() sweeps every fresh entry either way; the indexes serve lookups "
        "by name and claim id, not label selectors"
        if ratio < NO_GAIN_BELOW
        else "gain, though list() never consults the indexes: noise?"
    )
    yield _row("list phase=Running, off/on", shape, ratio=ratio, note=note)


def _bench_get(store: SandboxStore, nodes: int, per_node: int) -> Iterator[Row]:
    """Get by name with the indexes on against off: random names anywhere in the fleet,
    the same names for both stores, measured back to back."""
    shape = f"{nodes}x{per_node}"
    enabled = store
    disabled = SandboxStore(store.source, RULE, clock=store.clock, indexed=False)
    rng = random.Random(2)
    picks = [(rng.randrange(nodes), rng.randrange(per_node)) for _ in range(GET_KEYS)]
    names = [f"sb-node-{n:03d}-{i}" for n, i in picks]
    assert all(
        enabled.get(DEFAULT_NAMESPACE, n) == disabled.get(DEFAULT_NAMESPACE, n) for n in names[:3]
    )

    def gets_on() -> None:
        get = enabled.get
        for name in names:
            get(DEFAULT_NAMESPACE, name)

    keys = itertools.cycle(names)
    on = measure(gets_on, runs=200, ops=GET_KEYS, max_seconds=1.0)
    off = measure(lambda: disabled.get(DEFAULT_NAMESPACE, next(keys)), runs=100, max_seconds=3.0)
    yield _row("get, index on", shape, **on.figures("us"))
    yield _row("get, index off", shape, **off.figures("ms"))
    yield _row(
        "get, off/on",
        shape,
        ratio=_ratio(off, on),
        note="index off scans view.entries('default') up to the name; p50 over random names",
    )


def _idle(watcher: Watcher) -> Callable[[], None]:
    """One tick that must send nothing: the fleet does not change between ticks."""

    def tick() -> None:
        if watcher.tick():
            raise AssertionError("an idle tick sent events")

    return tick


def _ratio(slow: Timing, fast: Timing) -> float:
    ratio = slow.p50_ns / fast.p50_ns
    return float(round(ratio)) if ratio >= 100 else round(ratio, 2)


def _row(case: str, fleet: str, **figures: object) -> Row:
    return {"benchmark": NAME, "case": case, "fleet": fleet, **figures}

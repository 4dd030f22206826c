"""guard-workers: what a reconcile tick costs, how soon a busy worker is protected, and
what the guard asks of the API server at steady state (all on the in-process API double).

- ``tick, 5000 pods, nothing to change``: ``Reconciler.tick`` over 5,000 guarded pods
  whose annotations already match (half busy and annotated, half idle and bare), read
  from real informers; p50 and p99. Beside it, ticks in which 50 of the pods change
  (50 stamps, then 50 clears: the tick waits for its patches), timed until the informer
  has seen them; the row's ``ratio`` is over the quiet tick. ``api_requests`` counts
  every request the double logged during the quiet ticks (the informers' open watches
  aside: a watch is one request, made before);
- ``busy -> annotated (sessions=URL)``: ``Guard.run`` with ``--interval 1s`` and a
  sessions endpoint over HTTP; a worker turns busy at a random moment and the time until
  its pod carries the annotation in the double's store is taken, 20 times (p50, p99).
  Beside it, the same with ``annotation=KEY`` (the worker reports on its own pod: the
  pod's watch event wakes the guard);
- ``API requests per tick, steady state``: the running guard over 5,000 pods for 20
  ticks with nothing changing: requests the double logged, divided by ticks.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from kubernetes import client

from benchmarks import Row, with_target
from benchmarks.timing import Timing, measure
from sandboxctl.guard.busy import AnnotationSource, BusySource, MemorySource
from sandboxctl.guard.decide import Busy
from sandboxctl.guard.pods import ANNOTATION, PodView
from sandboxctl.guard.reconcile import Reconciler
from sandboxctl.guard.service import Guard
from sandboxctl.guard.sessions import SessionsSource
from sandboxctl.guard.settings import GuardSettings
from sandboxctl.kube import PODS, CoreObjects, Informer, Pods
from sandboxctl_testing.kubeapi import Running, start

NAME = "guard"
PODS_COUNT = 5_000
NS = "workers"
TICK_TARGET_MS = 20.0
INTERVAL = 1.0
SAMPLES = 20
LATENCY_TARGET_S = INTERVAL + 0.1
MERGE = "application/merge-patch+json"


def run() -> Iterator[Row]:
    with TemporaryDirectory(prefix="bench-guard-") as scratch:
        log = Path(scratch) / "requests.jsonl"
        double = start(0, bookmark_seconds=1.0)
        double.server.settings.request_log = log
        api = client.ApiClient(client.Configuration(host=double.url))
        try:
            busy = _populate(double, PODS_COUNT)
            yield from _tick_rows(double, api, log, busy)
            yield from _steady_rows(double, api, log, busy)
            yield from _latency_rows(double, api)
        finally:
            api.close()
            double.stop()


# --- one tick -----------------------------------------------------------------------------


class Fixed(MemorySource):
    """Busy by name, answered from memory."""

    name = "fixed"

    def __init__(self, busy: set[str]) -> None:
        self.busy = busy

    def reading(self, pod: PodView) -> Busy:
        return Busy.BUSY if pod.name in self.busy else Busy.IDLE

    def detail(self, pod: PodView) -> str:
        return ""


def _populate(double: Running, count: int) -> set[str]:
    pods = double.store.registry.get("", "v1", "pods")
    assert pods is not None
    busy = set()
    for i in range(count):
        name = f"w{i:05d}"
        annotations = {}
        if i % 2 == 0:
            busy.add(name)
            annotations[ANNOTATION] = "true"
        body = {
            "metadata": {"name": name, "labels": {"app": "worker"}, "annotations": annotations},
            "spec": {"nodeName": f"node-{i % 100}", "containers": [{"name": "w", "image": "w"}]},
        }
        double.store.create(pods, NS, body, manager="bench")
    return busy


def _requests(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def _tick_rows(double: Running, api: client.ApiClient, log: Path, busy: set[str]) -> Iterator[Row]:
    settings = GuardSettings(namespace=NS, selector="app=worker").validate()
    informer = Informer(CoreObjects(api, PODS), namespace=NS, label_selector="app=worker",
                        watch_seconds=600, name="bench-pods")  # fmt: skip
    informer.start()
    assert informer.wait_synced(60)
    _wait(lambda: informer.stats.watches >= 1)  # its watch is open: not a tick's request
    reconciler = Reconciler(settings, informer, Fixed(busy), Pods(api))
    try:
        reconciler.tick()  # views built once
        before = _requests(log)
        warm = measure(reconciler.tick, runs=200, warmup=5, max_seconds=20)
        requests = _requests(log) - before
        sent = reconciler.last.planned
        source = reconciler.source
        assert isinstance(source, Fixed)
        flipping = [f"w{i:05d}" for i in range(1, 100, 2)]  # 50 idle pods
        rounds = [0]

        def changing() -> None:
            # 50 pods turn busy (or idle again): 50 stamps (or clears) in this tick.
            if rounds[0] % 2 == 0:
                source.busy.update(flipping)
            else:
                source.busy.difference_update(flipping)
            rounds[0] += 1
            reconciler.tick()
            _settle(double, informer)

        changes = measure(changing, runs=20, warmup=2, max_seconds=60)
    finally:
        reconciler.close()
        informer.stop()
    row = _row(
        f"tick, {PODS_COUNT} pods, nothing to change",
        **warm.figures("ms"),
        api_requests=requests,
        planned=sent,
    )
    met = warm.p50_ns / 1e6 <= TICK_TARGET_MS and requests == 0
    yield with_target(row, met, f"p50 <= {TICK_TARGET_MS:g} ms, 0 API requests")
    yield _row(
        f"tick, {PODS_COUNT} pods, 50 of them changing",
        **changes.figures("ms"),
        ratio=round(changes.p50_ns / warm.p50_ns, 2),
    )


def _settle(double: Running, informer: Informer) -> None:
    """Until the informer has seen every write (the double's versions are integers)."""
    target = double.store.rv
    while int(informer.resource_version or 0) < target:
        time.sleep(0.001)


# --- a running guard ----------------------------------------------------------------------


def _guard(api: client.ApiClient, source: BusySource, interval: float) -> tuple[Guard, Any]:
    settings = GuardSettings(
        namespace=NS, selector="app=worker", interval=timedelta(seconds=interval)
    ).validate()
    guard = Guard(settings, api, lambda pods, on_verdict: source, watch_seconds=600,
                  sync_timeout=timedelta(seconds=60))  # fmt: skip
    assert guard.start()
    informers = [guard.pods] + ([guard.nodes] if guard.nodes is not None else [])
    # Synced means listed; the watches open just after: wait for them, so they are not
    # counted as a tick's requests.
    _wait(lambda: all(informer.stats.watches >= 1 for informer in informers))
    loop = threading.Thread(target=guard.run, name="bench-guard", daemon=True)
    loop.start()
    return guard, loop


def _steady_rows(
    double: Running, api: client.ApiClient, log: Path, busy: set[str]
) -> Iterator[Row]:
    interval = 0.25
    guard, loop = _guard(api, Fixed(busy), interval)
    try:
        count_before = _count(guard)
        requests_before = _requests(log)
        time.sleep(20 * interval)
        ticks = _count(guard) - count_before
        requests = _requests(log) - requests_before
    finally:
        guard.stop()
        loop.join(timeout=10)
        guard.close()
    per_tick = requests / max(1, ticks)
    row = _row("API requests per tick, steady state", ticks=ticks, api_requests=requests,
               requests_per_tick=round(per_tick, 3))  # fmt: skip
    yield with_target(row, requests == 0 and ticks > 0, "0 per tick")


def _count(guard: Guard) -> int:
    for metric in guard.metrics.tick_seconds.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count"):
                return int(sample.value)
    return 0


class Sessions:
    """A sessions endpoint: ``{pod: count}`` over HTTP."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                body = json.dumps(outer.counts).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/sessions"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _latency_rows(double: Running, api: client.ApiClient) -> Iterator[Row]:
    pods = double.store.registry.get("", "v1", "pods")
    assert pods is not None
    # Keep the rest of the fleet as it is: the 5,000 pods stay, all idle here.
    for name in [f"w{i:05d}" for i in range(0, PODS_COUNT, 2)]:
        double.store.patch(pods, NS, name, MERGE, {"metadata": {"annotations": {ANNOTATION: None}}},
                           manager="bench")  # fmt: skip
    sessions = Sessions()
    source = SessionsSource(sessions.url, INTERVAL, 2.0)
    guard, loop = _guard(api, source, INTERVAL)
    rng = random.Random(7)
    try:

        def busy(name: str, on: bool) -> None:
            sessions.counts = {name: 1} if on else {}

        via_sessions = _latency(double, pods, busy, rng)
    finally:
        guard.stop()
        loop.join(timeout=10)
        guard.close()
        sessions.close()
    row = _row("busy -> annotated (sessions=URL, --interval 1s)", **via_sessions.figures("ms"))
    yield with_target(
        row,
        via_sessions.p50_ns / 1e9 <= LATENCY_TARGET_S,
        f"p50 <= interval + 100 ms ({LATENCY_TARGET_S * 1000:g} ms)",
    )

    key = "example.com/busy"
    guard, loop = _guard(api, AnnotationSource(key), INTERVAL)
    try:

        def report(name: str, on: bool) -> None:
            value = "1" if on else None
            double.store.patch(pods, NS, name, MERGE, {"metadata": {"annotations": {key: value}}},
                               manager="worker")  # fmt: skip

        via_pod = _latency(double, pods, report, rng)
    finally:
        guard.stop()
        loop.join(timeout=10)
        guard.close()
    yield _row(
        "busy -> annotated (annotation=KEY, the pod's event)",
        **via_pod.figures("ms"),
        ratio=round(via_pod.p50_ns / via_sessions.p50_ns, 3),
    )


def _latency(double: Running, pods: Any, turn: Any, rng: random.Random) -> Timing:
    samples = []
    for i in range(SAMPLES):
        name = f"w{(i * 37) % PODS_COUNT:05d}"
        time.sleep(rng.uniform(0, INTERVAL))  # a random phase against the guard's polls
        started = time.perf_counter_ns()
        turn(name, True)
        _wait(lambda n=name: _annotation(double, pods, n) == "true")
        samples.append(time.perf_counter_ns() - started)
        turn(name, False)
        _wait(lambda n=name: _annotation(double, pods, n) is None)
    return Timing(tuple(sorted(samples)))


def _annotation(double: Running, pods: Any, name: str) -> str | None:
    value: str | None = (double.store.get(pods, NS, name)["metadata"].get("annotations") or {}).get(
        ANNOTATION
    )
    return value


def _wait(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("the guard did not act within 30 s")
        time.sleep(0.002)


def _row(case: str, **figures: Any) -> Row:
    return {"benchmark": NAME, "case": case, **figures}

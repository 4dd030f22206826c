"""The reconciler: every tick, ``decide`` for each guarded pod from the informer's cache,
then send the few merge patches the decisions ask for.

* Reads only caches (pods, nodes, the busy source): a tick with nothing to change makes
  **no** API request, whatever the number of pods.
* Patches run on a pool of ``max_concurrency`` threads, each call with ``patch_timeout``.
  A tick waits for them at most ``budget`` seconds; what is still queued then is left for
  the next tick and what is running goes on, its pod skipped until it is done, so ticks
  never stack.
* Failures: 404 forgets the pod; 409 or 422 (a conflict, or a name that now holds
  another pod) re-reads the pod and decides again, at most ``conflict_retries`` times
  with jitter; anything else (429, 5xx, a timeout, no answer) backs off per pod,
  exponentially. Nothing here ever holds the busy source's lock during a call.
* State is kept by pod UID, so a pod recreated under the same name starts clean.
* ``dry_run`` prints each patch it would send, once per pod version, and sends nothing.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from sandboxctl.clock import Clock, SystemClock
from sandboxctl.guard.busy import BusySource
from sandboxctl.guard.decide import (
    IN_SYNC,
    Busy,
    Change,
    Clear,
    Decision,
    Memory,
    Op,
    Stamp,
    Wait,
    backoff_seconds,
    decide,
    merge_patch,
    note_busy,
    settled_reading,
)
from sandboxctl.guard.metrics import GuardMetrics
from sandboxctl.guard.pods import NodeView, Override, PodShape, PodView, node_view, pod_view
from sandboxctl.guard.settings import GuardSettings
from sandboxctl.kube.corekinds import PodCalls
from sandboxctl.kube.errors import KubeConflict, KubeError, KubeInvalid, KubeNotFound

log = logging.getLogger(__name__)

V = TypeVar("V")


class Cache(Protocol):
    """What the reconciler reads of an informer."""

    @property
    def synced(self) -> bool: ...

    def items(self) -> list[dict[str, Any]]: ...

    def get(self, name: str, namespace: str = "") -> dict[str, Any] | None: ...


class NotSynced(RuntimeError):
    """The caches have not synced: a cold cache must not answer."""


class ViewCache(Generic[V]):
    """Views of a cache's objects, each built once per object version (the informer
    replaces an object's dict when it changes, so the dict's identity is its version)."""

    def __init__(self, build: Callable[[dict[str, Any]], V]) -> None:
        self._build = build
        self._views: dict[int, tuple[dict[str, Any], V]] = {}

    def refresh(self, objects: Sequence[dict[str, Any]]) -> list[V]:
        old, new, build = self._views, {}, self._build
        out = []
        for obj in objects:
            ident = id(obj)
            entry = old.get(ident)
            if entry is None or entry[0] is not obj:
                entry = (obj, build(obj))
            new[ident] = entry
            out.append(entry[1])
        self._views = new
        return out


@dataclass(slots=True)
class _Counts:
    """What a tick's metrics count of the pods it read."""

    busy: int = 0
    annotated: int = 0


@dataclass(frozen=True, slots=True)
class _Entry:
    """What a tick keeps of one pod: the object it was built from (its version), the
    view, the memory, and the reading in which the pod is settled."""

    obj: dict[str, Any]
    pod: PodView
    memory: Memory
    settled: Busy | None
    annotated: bool


@dataclass
class TickReport:
    pods: int = 0
    planned: int = 0
    sent: int = 0
    left: int = 0  # queued when the budget ran out: next tick
    seconds: float = 0.0
    decisions: dict[str, Decision] = field(default_factory=dict)  # uid -> not in sync


class Reconciler:
    def __init__(
        self,
        settings: GuardSettings,
        pods: Cache,
        source: BusySource,
        calls: PodCalls,
        *,
        nodes: Cache | None = None,
        clock: Clock | None = None,
        metrics: GuardMetrics | None = None,
        jitter: Callable[[], float] = random.random,
        printer: Callable[[str], None] = print,
    ) -> None:
        self.settings = settings
        self.rules = settings.rules
        self._pods = pods
        self._nodes = nodes
        self.source = source
        self._calls = calls
        self._clock = clock or SystemClock()
        self.metrics = metrics or GuardMetrics()
        self._jitter = jitter
        self._printer = printer
        shape: PodShape = settings.shape
        self._build: Callable[[dict[str, Any]], PodView] = lambda obj: pod_view(obj, shape)
        self._pod_views: ViewCache[PodView] = ViewCache(self._build)  # status, ensure
        self._entries: dict[int, _Entry] = {}  # the tick's
        self._node_views: ViewCache[NodeView] = ViewCache(node_view)
        self.memory: dict[str, Memory] = {}
        self._inflight: set[str] = set()
        self._printed: dict[str, tuple[Op, str]] = {}
        self._pool = ThreadPoolExecutor(settings.max_concurrency, thread_name_prefix="guard-patch")
        self._lock = threading.Lock()  # one tick at a time
        self.last: TickReport = TickReport()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- reads ----------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self._pods.synced and (self._nodes is None or self._nodes.synced)

    def pod_views(self) -> list[PodView]:
        return self._pod_views.refresh(self._pods.items())

    def node_views(self) -> dict[str, NodeView]:
        if self._nodes is None:
            return {}
        return {view.name: view for view in self._node_views.refresh(self._nodes.items())}

    def is_terminating(self, namespace: str, name: str) -> bool:
        """Whether the guarded pod ``namespace/name`` is Terminating, from the cache. A
        missing pod or an empty name is not; before the cache synced this raises
        NotSynced rather than answer "no" and fail open."""
        if not self._pods.synced:
            raise NotSynced("the pod cache has not synced")
        if not name:
            return False
        obj = self._pods.get(name, namespace)
        return obj is not None and bool((obj.get("metadata") or {}).get("deletionTimestamp"))

    def disrupted_nodes(self) -> frozenset[str]:
        return frozenset(name for name, view in self.node_views().items() if view.disrupted)

    # --- the tick -------------------------------------------------------------------------

    def tick(self) -> TickReport:
        """One pass over every guarded pod. Refuses to run before the caches have synced:
        a cold cache makes every busy pod look unannotated."""
        if not self.synced:
            raise NotSynced("the reconciler ran before the informers synced")
        with self._lock:
            return self._tick()

    def _tick(self) -> TickReport:
        clock = self._clock
        started = clock.monotonic()
        objects = self._pods.items()
        report = TickReport(pods=len(objects))
        plans, counts = self._plan(objects, started, report)
        report.planned = len(plans)
        if plans:
            self._send(plans, started, report)
        metrics = self.metrics
        metrics.pods_guarded.set(len(objects))
        metrics.pods_busy.set(counts.busy)
        metrics.pods_annotated.set(counts.annotated)
        metrics.mismatch.set(
            sum(1 for d in report.decisions.values() if isinstance(d, (Stamp, Clear, Wait)))
        )
        report.seconds = clock.monotonic() - started
        metrics.tick_seconds.observe(report.seconds)
        self.last = report
        return report

    def _plan(
        self, objects: list[dict[str, Any]], now: float, report: TickReport
    ) -> tuple[list[tuple[PodView, Change]], _Counts]:
        """Decide every pod whose reading is not its steady state (``settled_reading``) and
        that is not in flight: this loop runs over every pod on every tick. The decisions
        out of sync go in ``report``; the changes come back, with what the metrics count."""
        entries, inflight = self._entries, self._inflight
        disrupted = self.disrupted_nodes() if self.rules.respect_disrupted_taint else frozenset()
        rules, reading, busy_state = self.rules, self.source.reading, Busy.BUSY
        plans: list[tuple[PodView, Change]] = []
        created = busy_count = annotated_count = 0
        for obj in objects:
            entry = entries.get(id(obj))
            if entry is None or entry.obj is not obj:
                entry = entries[id(obj)] = self._entry(obj)
                created += 1
            pod, memory = entry.pod, entry.memory
            busy = reading(pod)
            if busy is not memory.reading:
                note_busy(memory, busy, now)
            busy_count += busy is busy_state
            annotated_count += entry.annotated
            if busy is entry.settled or pod.uid in inflight:
                continue
            decision = decide(pod, busy, memory, now, rules, pod.node in disrupted)
            if decision is IN_SYNC:
                continue
            report.decisions[pod.uid] = decision
            if isinstance(decision, (Stamp, Clear)):
                plans.append((pod, decision))
        if created or len(entries) != len(objects):
            self._prune(objects)
        return plans, _Counts(busy_count, annotated_count)

    def _entry(self, obj: dict[str, Any]) -> _Entry:
        """A pod's view and steady state (built once per version) and its memory (kept by
        UID)."""
        pod = self._build(obj)
        memory = self.memory.get(pod.uid)
        if memory is None:
            memory = self.memory[pod.uid] = Memory()
            if pod.override is Override.INVALID:
                log.warning(
                    "event=override-ignored pod=%s/%s label=%s value=%r (expected pin or off)",
                    pod.namespace, pod.name, self.settings.override_label, pod.override_text,
                )  # fmt: skip
        return _Entry(obj, pod, memory, settled_reading(pod), pod.annotated)

    def _prune(self, objects: list[dict[str, Any]]) -> None:
        """Forget the views and memories of pods no longer in the cache (deleted, or out
        of the selector): forgotten, never acted on."""
        entries = self._entries
        alive = {id(obj): entries[id(obj)] for obj in objects}
        self._entries = alive
        uids = {entry.pod.uid for entry in alive.values()}
        for uid in [uid for uid in self.memory if uid not in uids]:
            del self.memory[uid]

    def _send(self, plans: list[tuple[PodView, Change]], now: float, report: TickReport) -> None:
        futures: dict[Future[None], str] = {}
        for pod, change in plans:
            memory = self.memory.setdefault(pod.uid, Memory())
            memory.sent_op, memory.sent_version, memory.sent_at = (
                change.op,
                pod.resource_version,
                now,
            )
            self._inflight.add(pod.uid)
            futures[self._pool.submit(self._apply, pod, change, now)] = pod.uid
        remaining = now + self.settings.budget - self._clock.monotonic()
        done, pending = wait(futures, timeout=max(0.0, remaining))
        report.sent = len(done)
        for future in pending:
            if future.cancel():
                uid = futures[future]
                self._inflight.discard(uid)
                left_behind = self.memory.get(uid)
                if left_behind is not None:
                    left_behind.sent_op = None
                report.left += 1
        if pending:
            self.metrics.ticks_cut.inc()
            log.warning(
                "event=tick-budget-spent budget=%.3fs left=%d running=%d",
                self.settings.budget, report.left, len(pending) - report.left,
            )  # fmt: skip

    # --- one patch (on a pool thread) -----------------------------------------------------

    def _apply(self, pod: PodView, change: Change, now: float) -> None:
        try:
            if self.settings.dry_run:
                self._print(pod, change)
            else:
                self._patch(pod, change, now)
        except Exception:  # a bug must not leave the pod in flight forever
            log.exception("event=patch-crashed pod=%s/%s", pod.namespace, pod.name)
        finally:
            self._inflight.discard(pod.uid)

    def _patch(self, pod: PodView, change: Change, now: float) -> None:
        settings, metrics = self.settings, self.metrics
        timeout = settings.patch_timeout.total_seconds()
        memory = self.memory.get(pod.uid) or Memory()
        for attempt in range(1, settings.conflict_retries + 1):
            body = merge_patch(settings.annotation, change.op, pod.uid)
            metrics.api_requests.labels("patch").inc()
            try:
                self._calls.patch(pod.namespace, pod.name, body, timeout)
            except KubeNotFound:
                self.memory.pop(pod.uid, None)
                log.info("event=pod-gone pod=%s/%s uid=%s", pod.namespace, pod.name, pod.uid)
                return
            except (KubeConflict, KubeInvalid) as error:
                metrics.patch_errors.labels(_code(error)).inc()
                if attempt == settings.conflict_retries:
                    self._back_off(pod, memory, error, now)
                    return
                reread = self._reread(pod, memory, now)
                if reread is None:
                    return
                pod, next_change = reread
                if next_change is None:
                    return
                change = next_change
                self._pause(0.05 * attempt * (1 + self._jitter()))
                continue
            except KubeError as error:
                metrics.patch_errors.labels(_code(error)).inc()
                self._back_off(pod, memory, error, now)
                return
            self._landed(pod, change, memory)
            return

    def _reread(
        self, pod: PodView, memory: Memory, now: float
    ) -> tuple[PodView, Change | None] | None:
        """After 409 or 422: read the pod again and decide again. None when the name now
        holds another pod (a plan made for one pod never lands on its successor)."""
        self.metrics.api_requests.labels("get").inc()
        try:
            timeout = self.settings.patch_timeout.total_seconds()
            fresh = pod_view(self._calls.get(pod.namespace, pod.name, timeout), self.settings.shape)
        except KubeNotFound:
            self.memory.pop(pod.uid, None)
            return None
        except KubeError as error:
            self._back_off(pod, memory, error, now)
            return None
        if fresh.uid != pod.uid:
            log.info(
                "event=pod-replaced pod=%s/%s old_uid=%s new_uid=%s (plan dropped)",
                pod.namespace, pod.name, pod.uid, fresh.uid,
            )  # fmt: skip
            self.memory.pop(pod.uid, None)
            return None
        disrupted = fresh.node in self.disrupted_nodes()
        decision = decide(fresh, self.source.reading(fresh), Memory(idle_since=memory.idle_since),
                          now, self.rules, disrupted)  # fmt: skip
        return fresh, decision if isinstance(decision, (Stamp, Clear)) else None

    def _landed(self, pod: PodView, change: Change, memory: Memory) -> None:
        memory.failures, memory.retry_at = 0, 0.0
        self.metrics.patches.labels(change.op.value).inc()
        where = f"{pod.namespace}/{pod.name}"
        if isinstance(change, Stamp):
            memory.stamped = True
            if change.replaces is not None:
                log.warning(
                    "event=stamp pod=%s uid=%s replaced=%r (a value other than 'true' on a "
                    "busy pod is overwritten)",
                    where, pod.uid, change.replaces,
                )  # fmt: skip
            else:
                log.info("event=stamp pod=%s uid=%s node=%s", where, pod.uid, pod.node)
            return
        orphan = not memory.stamped
        memory.stamped = False
        if orphan:
            self.metrics.orphans_cleared.inc()
        log.info("event=clear pod=%s uid=%s orphan=%s", where, pod.uid, str(orphan).lower())

    def _back_off(self, pod: PodView, memory: Memory, error: KubeError, now: float) -> None:
        memory.failures += 1
        delay = backoff_seconds(
            memory.failures,
            self.settings.backoff_initial.total_seconds(),
            self.settings.backoff_max.total_seconds(),
            self._jitter(),
        )
        memory.retry_at = now + delay
        memory.sent_op = None
        log.warning(
            "event=patch-failed pod=%s/%s uid=%s code=%s retry_in=%.1fs error=%r",
            pod.namespace, pod.name, pod.uid, _code(error), delay, error.message,
        )  # fmt: skip

    def _pause(self, seconds: float) -> None:
        threading.Event().wait(seconds)

    def _print(self, pod: PodView, change: Change) -> None:
        version = (change.op, pod.resource_version)
        if self._printed.get(pod.uid) == version:
            return
        self._printed[pod.uid] = version
        line = {
            "dryRun": True,
            "op": change.op.value,
            "namespace": pod.namespace,
            "name": pod.name,
            "uid": pod.uid,
            "patch": merge_patch(self.settings.annotation, change.op, pod.uid),
        }
        self._printer(json.dumps(line, separators=(",", ":")))

    def preview(self, views: Sequence[PodView]) -> dict[str, tuple[Busy, Decision]]:
        """Each pod's reading and decision now, sending nothing (for ``status``)."""
        now = self._clock.monotonic()
        disrupted = self.disrupted_nodes()
        out = {}
        for pod in views:
            memory = self.memory.get(pod.uid) or Memory()
            busy = self.source.reading(pod)
            decision = decide(pod, busy, memory, now, self.rules, pod.node in disrupted)
            out[pod.uid] = (busy, decision)
        return out

    # --- embedders: stamp on acquire, before the worker is handed out -----------------------

    def ensure(self, namespace: str, name: str) -> Decision | None:
        """Decide for one pod now and, when a change is due, send it and wait for it. None
        when the pod is not in the cache."""
        with self._lock:
            pod = next((p for p in self.pod_views() if p.key == (namespace, name)), None)
            if pod is None:
                return None
            memory = self.memory.setdefault(pod.uid, Memory())
            now = self._clock.monotonic()
            busy = self.source.reading(pod)
            if busy is Busy.BUSY:
                note_busy(memory, busy, now)
            disrupted = pod.node in self.disrupted_nodes()
            decision = decide(pod, busy, memory, now, self.rules, disrupted)
            if isinstance(decision, (Stamp, Clear)) and pod.uid not in self._inflight:
                memory.sent_op, memory.sent_version, memory.sent_at = (
                    decision.op,
                    pod.resource_version,
                    now,
                )
                self._inflight.add(pod.uid)
                self._apply(pod, decision, now)
            return decision


def _code(error: KubeError) -> str:
    if error.status:
        return str(error.status)
    return "timeout" if "timeout" in error.message.lower() else "unavailable"

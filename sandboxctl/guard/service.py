"""``guard-workers run`` assembled: the informers, the busy source, the NodePool gate,
the reconcile loop and the status the HTTP endpoint serves.

Order of a start: the pod (and node) informers and the busy source start; nothing is
decided until all of them have synced (a cold cache makes busy pods look unannotated and
Terminating pods look alive); then the NodePool audit runs, and a FAIL refuses to
stamp (one line, exit 2) unless ``--allow-unbounded``; then the loop reconciles every
``interval``, and at once whenever a guarded pod, a node's disruption taint or a busy
reading changes (coalesced, at most one tick per ``MIN_SPACING``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from kubernetes import client

from sandboxctl.clock import Clock, SystemClock
from sandboxctl.core.durations import format_duration
from sandboxctl.core.errors import ConfigurationError
from sandboxctl.guard.audit import AuditInput, AuditReport, Level, audit
from sandboxctl.guard.busy import BusySource
from sandboxctl.guard.health import HEALTHY, Deferred, Lost, Verdict
from sandboxctl.guard.karpenter import AuditReadError, read_audit_input
from sandboxctl.guard.metrics import GuardMetrics
from sandboxctl.guard.pods import PodView, pod_view
from sandboxctl.guard.probe import OnVerdict, ProbeSource
from sandboxctl.guard.reconcile import Reconciler, ViewCache
from sandboxctl.guard.settings import GuardSettings
from sandboxctl.guard.status import status_document
from sandboxctl.kube import NODES, PODS, CoreObjects, Informer, Pods
from sandboxctl.kube.informer import DELETED
from sandboxctl.lifecycle import Loop, Stop

log = logging.getLogger(__name__)

MIN_SPACING = timedelta(milliseconds=50)  # between two ticks, so an event storm costs few ticks
SYNC_TIMEOUT = timedelta(minutes=2)
SYNC_POLL = 0.1  # seconds: how often a start waiting for the caches checks for stop()

PodsFn = Callable[[], Sequence[PodView]]
SourceFactory = Callable[[PodsFn, OnVerdict], BusySource]


class GuardStartError(ConfigurationError):
    """A cache did not sync in time: an RBAC grant, a selector or the API server to fix
    (one line)."""


class UnboundedRefusal(ConfigurationError):
    """The NodePool audit FAILed and ``--allow-unbounded`` was not given."""


class Guard:
    name = "guard"

    def __init__(
        self,
        settings: GuardSettings,
        api: client.ApiClient,
        make_source: SourceFactory,
        *,
        clock: Clock | None = None,
        metrics: GuardMetrics | None = None,
        nodepools: Sequence[str] = (),
        max_roll: timedelta | None = None,
        allow_unbounded: bool = False,
        sync_timeout: timedelta = SYNC_TIMEOUT,
        watch_seconds: int = 300,
        printer: Callable[[str], None] = print,
    ) -> None:
        self.settings = settings
        self._api = api
        self._clock = clock or SystemClock()
        self.metrics = metrics or GuardMetrics()
        self._nodepools = tuple(nodepools)
        self._max_roll = max_roll
        self._allow_unbounded = allow_unbounded
        self._sync_timeout = sync_timeout
        self._stopping = Stop()
        self._loop = Loop(
            "guard tick",
            self._tick,
            settings.interval,
            spacing=MIN_SPACING,
            logger=log,
            failed="event=tick-failed",
            monotonic=self._clock.monotonic,
        )
        self._disrupted: dict[str, bool] = {}
        self.pods = Informer(
            CoreObjects(api, PODS),
            self._pod_event,
            namespace=settings.namespace,
            label_selector=settings.label_selector,
            watch_seconds=watch_seconds,
            name="guard-pods",
        )
        self.nodes = (
            Informer(
                CoreObjects(api, NODES),
                self._node_event,
                watch_seconds=watch_seconds,
                name="guard-nodes",
            )
            if settings.respect_disrupted_taint
            else None
        )
        shape = settings.shape
        source_views: ViewCache[PodView] = ViewCache(lambda obj: pod_view(obj, shape))
        self.source = make_source(lambda: source_views.refresh(self.pods.items()), self._verdict)
        self.reconciler = Reconciler(
            settings,
            self.pods,
            self.source,
            Pods(api),
            nodes=self.nodes,
            clock=self._clock,
            metrics=self.metrics,
            printer=printer,
        )
        self.audit_report: AuditReport | None = None
        self.unbounded_allowed = False
        self.ready = False  # every cache and the source synced (``/healthz``)

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> bool:
        """Start the caches and the source; return True once all of them have synced,
        False when ``stop()`` came first."""
        self.pods.start()
        if self.nodes is not None:
            self.nodes.start()
        self.source.start(self.wake)
        deadline = self._clock.monotonic() + self._sync_timeout.total_seconds()
        waits: list[tuple[str, Callable[[float], bool], Callable[[], object]]] = [
            (f"pods in namespace {self.settings.namespace}", self.pods.wait_synced,
             lambda: self.pods.last_error),
            (self.source.name, self.source.wait_synced, lambda: None),
        ]  # fmt: skip
        if self.nodes is not None:
            nodes = self.nodes
            waits.append(("nodes", nodes.wait_synced, lambda: nodes.last_error))
        for what, wait_synced, last_error in waits:
            while not wait_synced(SYNC_POLL):
                if self._stopping.is_set():
                    return False
                if self._clock.monotonic() >= deadline:
                    self.close()
                    raise GuardStartError(
                        f"no first read of {what} within "
                        f"{format_duration(self._sync_timeout)}; nothing was stamped or "
                        f"cleared. Last error: {last_error() or 'none'}"
                    )
        log.info(
            "event=synced pods=%d source=%s selector=%r",
            len(self.pods.items()), self.source.name, self.settings.label_selector,
        )  # fmt: skip
        self.ready = True
        return True

    def gate(self) -> AuditReport:
        """Audit the NodePools under the guarded pods (and ``--nodepool``); refuse to stamp
        on a FAIL unless ``--allow-unbounded`` (or ``--dry-run``, which stamps nothing)."""
        views = self.reconciler.pod_views()
        nodes = list(self.reconciler.node_views().values()) if self.nodes is not None else None
        try:
            given = read_audit_input(
                self._api, views, configured=self._nodepools, max_roll=self._max_roll, nodes=nodes
            )
        except AuditReadError as error:
            if not self._allow_unbounded:
                raise
            log.warning("event=audit-unreadable error=%r (--allow-unbounded: stamping anyway)",
                        str(error))  # fmt: skip
            self.unbounded_allowed = True
            return audit(AuditInput({}, nodepool_api=False))
        report = audit(given)
        self.audit_report = report
        for finding in report.findings:
            level = logging.WARNING if finding.level in (Level.WARN, Level.FAIL) else logging.INFO
            log.log(
                level,
                "event=audit level=%s nodepool=%s rule=%s message=%r",
                finding.level.value, finding.nodepool, finding.rule, finding.message,
            )  # fmt: skip
        failures = report.failures()
        if failures:
            pools = ", ".join(sorted({f.nodepool for f in failures}))
            why = (
                f"NodePool {pools} has no terminationGracePeriod, so a busy pod's "
                "do-not-disrupt would block drift forever and wedge expiry"
            )
            if self._allow_unbounded or self.settings.dry_run:
                self.unbounded_allowed = True
                because = "--allow-unbounded" if self._allow_unbounded else "--dry-run"
                log.warning("event=audit-failed-but-stamping why=%r (%s)", why, because)
            else:
                self.close()
                raise UnboundedRefusal(
                    f"refusing to stamp: {why}; set it (see guard-workers audit-nodepools) "
                    "or pass --allow-unbounded"
                )
        return report

    def run(self, stop: Stop | None = None) -> None:
        """Reconcile at once, then every interval and on every change, until ``stop()``
        or ``stop`` is set (a runnable of the process manager: ``lifecycle``)."""
        if stop is not None:
            stop.on_set(self.stop)
        self._loop.run(self._stopping)

    def _tick(self) -> None:
        self.reconciler.tick()

    def stop(self) -> None:
        """End ``start``'s wait for the caches and ``run`` (safe from a signal handler)."""
        self._stopping.set()

    def wake(self) -> None:
        self._loop.wake()

    def close(self) -> None:
        self.stop()
        self.source.stop()
        self.pods.stop()
        if self.nodes is not None:
            self.nodes.stop()
        self.reconciler.close()

    # --- events ---------------------------------------------------------------------------

    def _pod_event(self, kind: str, obj: dict[str, Any]) -> None:
        self._loop.wake()

    def _node_event(self, kind: str, obj: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        taints = (obj.get("spec") or {}).get("taints") or []
        disrupted = kind != DELETED and any(
            isinstance(t, dict) and t.get("key") == "karpenter.sh/disrupted" for t in taints
        )
        if self._disrupted.get(name, False) != disrupted:
            self._disrupted[name] = disrupted
            self._loop.wake()

    def _verdict(self, pod: PodView, verdict: Verdict) -> None:
        if isinstance(verdict, Deferred):
            self.metrics.drains_deferred.inc()
        elif isinstance(verdict, Lost):
            self.metrics.workers_lost.labels(verdict.reason.value).inc()
        self._loop.wake()

    # --- status ---------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        settings = self.settings
        report = self.audit_report
        header: dict[str, Any] = {
            "synced": self.ready,
            "namespace": settings.namespace,
            "selector": settings.label_selector,
            "source": self.source.name,
            "dryRun": settings.dry_run,
            "audit": {
                "verdict": report.verdict.value if report is not None else "not-run",
                "unboundedAllowed": self.unbounded_allowed,
            },
        }
        if not self.ready:
            return status_document(header, [], {}, {}, self.source.detail)
        views = self.reconciler.pod_views()
        source = self.source
        verdict: Callable[[str], Verdict] = (
            source.verdict if isinstance(source, ProbeSource) else (lambda uid: HEALTHY)
        )
        return status_document(
            header,
            views,
            self.reconciler.preview(views),
            self.reconciler.node_views(),
            source.detail,
            verdict,
        )

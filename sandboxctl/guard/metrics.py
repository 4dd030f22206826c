"""The guard's Prometheus metrics (served on ``/metrics`` by ``guard.serve``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sandboxctl.guard.decide import Op

PREFIX = "sandboxctl_guard_"


class GuardMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.pods_guarded = Gauge(
            PREFIX + "pods_guarded", "Pods the guard watches (selector and owner).", registry=r
        )
        self.pods_busy = Gauge(PREFIX + "pods_busy", "Guarded pods read as busy.", registry=r)
        self.pods_annotated = Gauge(
            PREFIX + "pods_annotated", "Guarded pods carrying the annotation.", registry=r
        )
        self.mismatch = Gauge(
            PREFIX + "desired_vs_observed_mismatch",
            "Guarded pods whose annotation differs from what the guard wants.",
            registry=r,
        )
        self.patches = Counter(
            PREFIX + "patches_total", "Annotation patches that landed, by op.", ["op"], registry=r
        )
        self.patch_errors = Counter(
            PREFIX + "patch_errors_total",
            "Patches that failed, by HTTP status (or 'timeout', 'unavailable').",
            ["code"],
            registry=r,
        )
        self.orphans_cleared = Counter(
            PREFIX + "orphans_cleared_total",
            "Annotations cleared that this instance had not set (a dead owner's, a human's).",
            registry=r,
        )
        self.drains_deferred = Counter(
            PREFIX + "drains_deferred_total",
            "Busy Terminating workers whose 'lost' verdict was deferred to their deadline.",
            registry=r,
        )
        self.workers_lost = Counter(
            PREFIX + "workers_lost_total",
            "Workers declared lost, by reason.",
            ["reason"],
            registry=r,
        )
        self.tick_seconds = Histogram(
            PREFIX + "tick_seconds",
            "One reconcile tick: decisions and the patches it waited for.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.ticks_cut = Counter(
            PREFIX + "ticks_cut_total",
            "Ticks that hit their budget and left the rest for the next tick.",
            registry=r,
        )
        self.api_requests = Counter(
            PREFIX + "api_requests_total",
            "Requests the reconciler made to the API server (the informers' aside).",
            ["verb"],
            registry=r,
        )
        for op in Op:
            self.patches.labels(op.value)
        for verb in ("patch", "get"):
            self.api_requests.labels(verb)

"""The publisher's own ``/metrics``: when it last published, and how often it failed;
served on a thread of its own with every listener's read bounds (``sandboxctl.serving``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_asgi_app

from sandboxctl.serving import InBackground, bind
from sandboxctl.serving.bounds import ReadBounds

AGENT = "agent"  # the agent could not be read: nothing was applied
API = "api"  # the apply failed


class PublishMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.last_success = Gauge(
            "sandboxctl_publish_last_success_timestamp_seconds",
            "Unix time of the last successful apply (the publishedAt it carried).",
            registry=self.registry,
        )
        self.attempts = Counter(
            "sandboxctl_publish_attempts_total", "Publishes tried.", registry=self.registry
        )
        self.failures = Counter(
            "sandboxctl_publish_failures_total",
            "Publishes that applied nothing, by where they failed (agent or api).",
            ["reason"],
            registry=self.registry,
        )
        self.entries = Gauge(
            "sandboxctl_publish_entries",
            "Sandboxes in the last applied inventory.",
            registry=self.registry,
        )
        self.duration = Histogram(
            "sandboxctl_publish_duration_seconds",
            "One publish: the agent read and the apply.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        for reason in (AGENT, API):
            self.failures.labels(reason)
        self._server: InBackground | None = None

    def serve(self, host: str, port: int, bounds: ReadBounds | None = None) -> int:
        """Serve ``/metrics`` on a thread; returns the bound port (one line and exit 2
        when it cannot listen). ``bounds``: how the listener reads requests (default:
        every listener's)."""
        app = make_asgi_app(self.registry)
        self._server = InBackground(app, bind(host, port), bounds)
        return self._server.port

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

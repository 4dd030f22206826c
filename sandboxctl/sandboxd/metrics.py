"""Prometheus metrics of one agent: request counts and latency per route (the latency in
the shape every service shares, ``serving.metrics``), the pools at scrape time, each
claimed sandbox's newest usage sample, and what sampling costs."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from sandboxctl.agentapi.models import AgentInfo
from sandboxctl.sandboxd.usage import UsageSampler
from sandboxctl.serving.metrics import Observe, RequestTimes

SERVICE = "sandboxd"


class AgentMetrics:
    """``request_histograms=False`` leaves out the latency histogram (the benchmark of
    its cost compares the two)."""

    def __init__(
        self,
        info: Callable[[], AgentInfo],
        usage: UsageSampler | None = None,
        request_histograms: bool = True,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "sandboxd_requests_total",
            "HTTP requests answered, by route template, method and status.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self._times = RequestTimes(self.registry) if request_histograms else None
        self.registry.register(_PoolCollector(info))
        if usage is not None:
            self.registry.register(_UsageCollector(usage))

    def of(self, service: str) -> Observe:
        """The observer of ``service``'s requests (``serving.metrics.timed`` asks for
        it): each is counted, and timed unless the histograms are left out."""
        timed = self._times.of(service) if self._times is not None else None

        def observe(route: str, method: str, status: str, seconds: float) -> None:
            self.requests.labels(route, method, status).inc()
            if timed is not None:
                timed(route, method, status, seconds)

        return observe

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _PoolCollector(Collector):
    """Reads the agent's state when scraped, so the figures are never out of date."""

    def __init__(self, info: Callable[[], AgentInfo]) -> None:
        self._info = info

    def collect(self) -> Iterator[GaugeMetricFamily]:
        info = self._info()
        labels = ["template", "net", "size"]
        warm = GaugeMetricFamily("sandboxd_pool_warm", "Warm sandboxes per pool.", labels=labels)
        target = GaugeMetricFamily("sandboxd_pool_target", "Warm target per pool.", labels=labels)
        for pool in info.pools:
            values = [pool.key.template, pool.key.net, pool.key.size]
            warm.add_metric(values, pool.warm)
            target.add_metric(values, pool.target)
        yield warm
        yield target
        yield GaugeMetricFamily("sandboxd_claimed", "Claimed sandboxes.", value=info.claimed)
        yield GaugeMetricFamily(
            "sandboxd_hibernated", "Claimed sandboxes that are paused.", value=info.hibernated
        )
        yield GaugeMetricFamily("sandboxd_capacity", "Claim capacity.", value=info.capacity)


class _UsageCollector(Collector):
    """Each claimed sandbox's newest usage sample, and the sampler's own cost."""

    def __init__(self, usage: UsageSampler) -> None:
        self._usage = usage

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["sandbox"]
        gauges = {
            "cpu_used_pct": GaugeMetricFamily(
                "sandboxd_sandbox_cpu_used_percent",
                "CPU use over the last sampling interval, in percent of the sandbox's CPUs.",
                labels=labels,
            ),
            "mem_used": GaugeMetricFamily(
                "sandboxd_sandbox_memory_used_bytes",
                "Memory in use, without reclaimable page cache.",
                labels=labels,
            ),
            "mem_cache": GaugeMetricFamily(
                "sandboxd_sandbox_memory_cache_bytes", "Page cache.", labels=labels
            ),
            "mem_total": GaugeMetricFamily(
                "sandboxd_sandbox_memory_limit_bytes", "Memory limit.", labels=labels
            ),
            "disk_used": GaugeMetricFamily(
                "sandboxd_sandbox_disk_used_bytes", "Disk the home directory takes.", labels=labels
            ),
        }
        for sandbox_id, sample in sorted(self._usage.latest().items()):
            for name, family in gauges.items():
                family.add_metric([sandbox_id], getattr(sample, name))
        yield from gauges.values()
        cost = self._usage.cost
        yield CounterMetricFamily(
            "sandboxd_usage_samples", "Usage samples taken.", value=cost.samples
        )
        yield CounterMetricFamily(
            "sandboxd_usage_sampling_cpu_seconds",
            "CPU time the usage sampler spent.",
            value=cost.cpu_ns / 1e9,
        )

"""Prometheus metrics of one agent: request counts per route, and the pools at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sandboxctl.agentapi.models import AgentInfo

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class AgentMetrics:
    def __init__(self, info: Callable[[], AgentInfo]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "sandboxd_requests_total",
            "HTTP requests answered, by route template, method and status.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.registry.register(_PoolCollector(info))

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

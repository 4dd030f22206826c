"""One publish, and the loop that repeats it.

A publish reads the agent (``GET /v1/info``, then ``GET /v1/sandboxes``), maps the
answers with the one agent mapping (``agentapi.mapping.inventory_from_agent``), stamps
``publishedAt`` with this host's clock when the answers arrived, and server-side applies
the object with the field manager ``sandboxctl-publish``, forced: the publisher owns
every field it writes, and a field it stops writing (``publishedAt`` under
``--no-stamp``) is removed.

Failure policy: an agent that cannot be read means **nothing is applied**, so the node's
stamp ages and every reader drops it after the freshness window, as it should. An API
failure the server may recover from (no answer, 5xx, 429) is retried with exponential
backoff (tenacity) within the interval, each try reading the agent and stamping anew; a
refusal (403, 422) waits for the next tick. Nothing is ever deleted, on exit or
otherwise: a stopped publisher's node goes stale, and comes back with its next publish.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

import tenacity

from sandboxctl.agentapi.errors import AgentApiError
from sandboxctl.agentapi.mapping import inventory_from_agent
from sandboxctl.agentapi.models import AgentInfo, SandboxRow
from sandboxctl.clock import Clock, SystemClock
from sandboxctl.core.model import NodeInventory, inventory_to_object
from sandboxctl.kube.errors import KubeError
from sandboxctl.kube.resources import CustomObjects
from sandboxctl.lifecycle import Loop, Stop
from sandboxctl.publisher.metrics import AGENT, API, PublishMetrics

log = logging.getLogger(__name__)

FIELD_MANAGER = "sandboxctl-publish"
DEFAULT_INTERVAL = timedelta(seconds=30)
BACKOFF_INITIAL = 0.5


class AgentReads(Protocol):
    def info(self) -> AgentInfo: ...

    def sandboxes(self) -> Sequence[SandboxRow]: ...


class Outcome(enum.StrEnum):
    PUBLISHED = "published"
    AGENT_FAILED = "agent-failed"  # nothing applied
    API_FAILED = "api-failed"


@dataclass(frozen=True, slots=True)
class Result:
    outcome: Outcome
    reason: str = ""
    inventory: NodeInventory | None = None


def published_object(inventory: NodeInventory) -> dict[str, Any]:
    """The NodeInventory object a publisher applies: the inventory, plus the counts the
    printer columns show."""
    obj = inventory_to_object(inventory)
    obj["metadata"] = {"name": inventory.node}
    obj["summary"] = {
        "sandboxes": len(inventory.entries),
        "warm": sum(pool.warm for pool in inventory.pools),
    }
    return obj


class Publisher:
    name = "publisher"

    def __init__(
        self,
        node: str,
        agent: AgentReads,
        objects: CustomObjects,
        *,
        interval: timedelta = DEFAULT_INTERVAL,
        stamp: bool = True,
        clock: Clock | None = None,
        metrics: PublishMetrics | None = None,
        backoff_initial: float = BACKOFF_INITIAL,
    ) -> None:
        self.node = node
        self._agent = agent
        self._objects = objects
        self.interval = interval
        self._stamp = stamp
        self._clock = clock or SystemClock()
        self.metrics = metrics or PublishMetrics()
        self._backoff = backoff_initial
        self._failing: str | None = None  # the last failure's kind, to log each change once

    def publish_once(self) -> Result:
        """Read the agent and apply; never raises for a failure of either."""
        self.metrics.attempts.inc()
        started = time.perf_counter()
        try:
            info = self._agent.info()
            rows = self._agent.sandboxes()
            if info.node != self.node:
                raise AgentApiError(
                    f"the agent reports node {info.node!r}, not --node {self.node!r}"
                )
            inventory = inventory_from_agent(info, rows, published_at=self._clock.now())
        except AgentApiError as error:
            self.metrics.failures.labels(AGENT).inc()
            return self._failed(Outcome.AGENT_FAILED, f"agent: {error}")
        if not self._stamp:
            inventory = dataclasses.replace(inventory, published_at=None)
        try:
            self._objects.apply(published_object(inventory), FIELD_MANAGER, force=True)
        except KubeError as error:
            self.metrics.failures.labels(API).inc()
            result = self._failed(Outcome.API_FAILED, str(error))
            if error.retryable:
                raise _Retry(result) from error
            return result
        self.metrics.duration.observe(time.perf_counter() - started)
        self.metrics.entries.set(len(inventory.entries))
        stamp = inventory.published_at or self._clock.now()
        self.metrics.last_success.set(stamp.timestamp())
        if self._failing is not None:
            log.info("published node %s again", self.node)
            self._failing = None
        return Result(Outcome.PUBLISHED, inventory=inventory)

    def publish(self, stopping: Stop | threading.Event | None = None) -> Result:
        """One publish, retrying an API failure the server may recover from with
        exponential backoff for up to one interval."""
        stopping = stopping or Stop()
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_Retry),
            wait=tenacity.wait_exponential_jitter(
                multiplier=self._backoff, max=self.interval.total_seconds(), jitter=self._backoff
            ),
            stop=tenacity.stop_after_delay(self.interval.total_seconds())
            | tenacity.stop_when_event_set(stopping),  # type: ignore[arg-type]
            sleep=lambda seconds: _pause(stopping, seconds),
            reraise=True,
        )
        try:
            return retrying(self.publish_once)
        except _Retry as gave_up:
            return gave_up.result

    def run(self, stop: Stop) -> None:
        """Publish at once, then every interval, until ``stop`` (a runnable: ``lifecycle``)."""
        Loop(f"publish of node {self.node}", lambda: self.publish(stop), self.interval).run(stop)

    def _failed(self, outcome: Outcome, reason: str) -> Result:
        if self._failing != outcome.value:
            what = "nothing applied" if outcome is Outcome.AGENT_FAILED else "apply failed"
            log.warning("node %s: %s (%s); it goes stale if this lasts", self.node, reason, what)
            self._failing = outcome.value
        return Result(outcome, reason)


def _pause(stopping: Stop | threading.Event, seconds: float) -> None:
    stopping.wait(seconds)


class _Retry(Exception):
    def __init__(self, result: Result) -> None:
        super().__init__(result.reason)
        self.result = result

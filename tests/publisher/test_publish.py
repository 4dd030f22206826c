"""The publisher against the double, with an agent stand-in: what one publish applies and
owns, --no-stamp, an unreadable agent, API failures and their backoff, and the metrics."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from sandboxctl.agentapi import AgentInfo, AgentUnreachable, SandboxList, SandboxRow
from sandboxctl.clock import ManualClock
from sandboxctl.kube import NODE_INVENTORIES, CustomObjects
from sandboxctl.publisher import FIELD_MANAGER, Outcome, Publisher
from sandboxctl_testing.kubeapi.server import Fault
from tests.testing.kubeapi.double import Kube

NI = ("sandbox.cocoonstack.io", "v1beta1", "nodeinventories")
T0 = datetime(2026, 11, 30, 4, 0, tzinfo=UTC)


class StandInAgent:
    """Answers info and sandboxes like a node-a agent with two claims; ``down`` makes it
    unreachable."""

    def __init__(self) -> None:
        self.down = False
        self.info_json: dict[str, Any] = {
            "node": "node-a",
            "advertise_addr": "10.0.0.1:7777",
            "pools": [{"key": {"template": "base"}, "warm": 2, "target": 3}],
            "claimed": 2,
            "capacity": 64,
        }
        rows = [
            {
                "id": f"sb_000{i}",
                "key": {"template": "base"},
                "claim_ref": f"default/s{i}",
                "claimed_at": "2026-11-30T03:59:00Z",
                "deadline": "2026-11-30T04:30:00Z",
            }
            for i in (1, 2)
        ]
        self.rows = rows

    def info(self) -> AgentInfo:
        if self.down:
            raise AgentUnreachable("10.0.0.1:7777", "connection refused", undelivered=True)
        return AgentInfo.from_json(self.info_json)

    def sandboxes(self) -> Sequence[SandboxRow]:
        return SandboxList.from_json({"sandboxes": self.rows}).sandboxes


def publisher(kube: Kube, agent: StandInAgent, clock: ManualClock, **options: Any) -> Publisher:
    return Publisher(
        "node-a", agent, CustomObjects(kube.api, NODE_INVENTORIES), clock=clock, **options
    )


def read(kube: Kube) -> dict[str, Any]:
    return client.CustomObjectsApi(kube.api).get_cluster_custom_object(*NI, "node-a")  # type: ignore[no-any-return]


def test_a_publish_stamps_and_owns_its_fields(kube: Kube) -> None:
    agent, clock = StandInAgent(), ManualClock(T0)
    result = publisher(kube, agent, clock).publish_once()
    assert result.outcome is Outcome.PUBLISHED
    obj = read(kube)
    assert obj["publishedAt"] == "2026-11-30T04:00:00Z"
    assert obj["node"] == "node-a"
    assert obj["address"] == "10.0.0.1:7777"
    assert [e["name"] for e in obj["entries"]] == ["default/s1", "default/s2"]
    assert obj["summary"] == {"sandboxes": 2, "warm": 2}
    (owner,) = obj["metadata"]["managedFields"]
    assert owner["manager"] == FIELD_MANAGER
    assert owner["operation"] == "Apply"
    assert {"f:publishedAt", "f:entries", "f:pools", "f:address"} <= owner["fieldsV1"].keys()
    # A hand edit is overwritten by the next publish (forced ownership).
    client.CustomObjectsApi(kube.api).patch_cluster_custom_object(*NI, "node-a", {"address": "x:1"})
    clock.advance(30)
    publisher(kube, agent, clock).publish_once()
    again = read(kube)
    assert again["address"] == "10.0.0.1:7777"
    assert again["publishedAt"] == "2026-11-30T04:00:30Z"


def test_no_stamp_publishes_without_published_at(kube: Kube) -> None:
    agent, clock = StandInAgent(), ManualClock(T0)
    publisher(kube, agent, clock).publish_once()
    assert "publishedAt" in read(kube)
    publisher(kube, agent, clock, stamp=False).publish_once()
    assert "publishedAt" not in read(kube)  # it stopped owning the field, so it is gone


def test_an_unreadable_agent_publishes_nothing(kube: Kube) -> None:
    agent, clock = StandInAgent(), ManualClock(T0)
    one = publisher(kube, agent, clock)
    one.publish_once()
    version = read(kube)["metadata"]["resourceVersion"]
    agent.down = True
    clock.advance(30)
    result = one.publish_once()
    assert result.outcome is Outcome.AGENT_FAILED
    assert read(kube)["metadata"]["resourceVersion"] == version
    assert one.metrics.failures.labels("agent")._value.get() == 1


def test_a_node_name_the_agent_disowns_publishes_nothing(kube: Kube) -> None:
    agent, clock = StandInAgent(), ManualClock(T0)
    agent.info_json["node"] = "node-z"
    result = publisher(kube, agent, clock).publish_once()
    assert result.outcome is Outcome.AGENT_FAILED
    assert "node-z" in result.reason
    assert client.CustomObjectsApi(kube.api).list_cluster_custom_object(*NI)["items"] == []


def test_api_failures_back_off_and_recover(double_kube: Kube) -> None:
    """On the double: it answers 503 to exactly the next three applies, and 422 to the
    next five, which a real kube-apiserver does on no request."""
    kube = double_kube
    agent, clock = StandInAgent(), ManualClock(T0)
    one = publisher(kube, agent, clock, interval=timedelta(seconds=5), backoff_initial=0.02)
    kube.running.server.faults.append(Fault("PATCH", "nodeinventories", 503, 3))
    result = one.publish(threading.Event())
    assert result.outcome is Outcome.PUBLISHED
    assert one.metrics.failures.labels("api")._value.get() == 3
    assert one.metrics.attempts._value.get() == 4
    # A refusal (422) is not retried within the tick.
    kube.running.server.faults.append(Fault("PATCH", "nodeinventories", 422, 5))
    refused = one.publish(threading.Event())
    assert refused.outcome is Outcome.API_FAILED
    assert one.metrics.attempts._value.get() == 5


def test_metrics_are_served(kube: Kube) -> None:
    agent, clock = StandInAgent(), ManualClock(T0)
    one = publisher(kube, agent, clock)
    port = one.metrics.serve("127.0.0.1", 0)
    try:
        one.publish_once()
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        one.metrics.close()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("sandboxctl_publish_last_success_timestamp_seconds", ())] == T0.timestamp()
    assert samples[("sandboxctl_publish_failures_total", (("reason", "agent"),))] == 0
    assert samples[("sandboxctl_publish_entries", ())] == 2

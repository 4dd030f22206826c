"""Publishers and kube-source readers as real processes on the real control plane, each
as its own service account with the manifests' rights: what a publish
applies, --no-stamp, an unreadable agent, a killed publisher's node leaving every
reader within the window, a control-plane outage (kube-apiserver stopped, or etcd under
it), and a publisher's clock an hour ahead.

Every bound is the freshness rule's (docs/configuration.md): a node whose publisher died at
``t0`` leaves between ``STALE_AFTER`` and ``STALE_AFTER + INTERVAL`` after ``t0`` (plus
the one-second precision of ``publishedAt`` and a read's tick), and within
``STALE_AFTER`` plus one tick with the extrapolating reference.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sandboxctl.agentapi import AgentClient
from sandboxctl.clock import SystemClock
from sandboxctl.core.timestamps import parse_rfc3339
from sandboxctl.kube import NODE_INVENTORIES, CustomObjects
from sandboxctl.kube.connect import api_client
from sandboxctl.lifecycle import Background
from sandboxctl.publisher import Publisher
from tests.fleet.kube.fleet import (
    E2B_KEY,
    INTERVAL,
    ROOT_TOKEN,
    STALE_AFTER,
    KubeFleet,
    Watch,
    first_times,
    skip_reason,
)
from tests.sandboxd.servers import wait_until

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))
TICK = 1.0  # the Sandbox API watch's inventory tick
PRECISION = 1.0  # publishedAt has whole seconds


def metric(port: int, name: str, **labels: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    raise AssertionError(f"no {name} {labels}")


def test_publish_unstamped_and_an_unreadable_agent(kube_fleet: KubeFleet) -> None:
    a = kube_fleet.add_node("node-a")
    kube_fleet.add_node("old", publish_args=("--no-stamp",))
    dead = kube_fleet.add_node("node-c")
    kube_url, _ = kube_fleet.add_apiserver()
    kube_fleet.ready()
    for name in ("node-a", "old", "node-c"):
        kube_fleet.claim_on(name, f"default/on-{name}")
    everyone = {"on-node-a", "on-old", "on-node-c"}
    wait_until(lambda: everyone <= kube_fleet.listed(kube_url), timeout=15, what="all listed")
    # What a publish applies and owns.
    obj = kube_fleet.inventory("node-a")
    assert obj is not None
    assert obj["address"] == a.address
    assert [m["manager"] for m in obj["metadata"]["managedFields"]] == ["sandboxctl-publish"]
    stamp = parse_rfc3339(obj["publishedAt"])
    assert abs((datetime.now(UTC) - stamp).total_seconds()) < INTERVAL + PRECISION + 1
    assert metric(a.metrics_port, "sandboxctl_publish_last_success_timestamp_seconds") > 0
    old = kube_fleet.inventory("old")
    assert old is not None
    assert "publishedAt" not in old
    # node-c's agent stops; its publisher goes on, and applies nothing. (The version is
    # read after a first failed publish: one whose agent read came just before the stop
    # may still have applied.)
    dead.agent.stop()
    kube_fleet.nodes["old"].publisher.kill()  # an old publisher that dies never goes stale

    def failures() -> float:
        return metric(dead.metrics_port, "sandboxctl_publish_failures_total", reason="agent")

    wait_until(lambda: failures() >= 1, what="a failed publish")
    version = kube_fleet.inventory("node-c")["metadata"]["resourceVersion"]  # type: ignore[index]
    wait_until(lambda: failures() >= 3, what="two more failed publishes")
    current = kube_fleet.inventory("node-c")
    assert current is not None
    assert current["metadata"]["resourceVersion"] == version
    wait_until(
        lambda: "on-node-c" not in kube_fleet.listed(kube_url),
        timeout=STALE_AFTER + 5,
        what="node-c to leave",
    )
    assert {"on-node-a", "on-old"} <= kube_fleet.listed(kube_url)  # judged at the same reads


DELIVERY = 1.0  # seconds


def test_a_killed_publishers_node_leaves_every_reader_within_the_window(
    kube_fleet: KubeFleet,
) -> None:
    kube_fleet.add_node("node-a")
    kube_fleet.add_node("victim")
    modes = ("publish", "extrapolate")
    servers = {m: kube_fleet.add_apiserver("--inventory-reference", m) for m in modes}
    proxies = {m: kube_fleet.add_proxy("--inventory-reference", m) for m in modes}
    kube_fleet.ready()
    grant = kube_fleet.claim_on("victim", "default/doomed")
    for mode in modes:
        kube_url, e2b_url = servers[mode]
        wait_until(lambda u=kube_url: "doomed" in kube_fleet.listed(u), timeout=15, what="listed")
        assert kube_fleet.e2b_status(e2b_url, grant) == 200
        assert kube_fleet.proxy_status(proxies[mode], grant) != 502
    watches = {m: Watch(servers[m][0]) for m in modes}
    checks: dict[str, Callable[[], bool]] = {}
    for m in modes:
        kube_url, e2b_url = servers[m]
        checks[f"{m} list"] = lambda u=kube_url: "doomed" not in kube_fleet.listed(u)
        checks[f"{m} e2b"] = lambda u=e2b_url: kube_fleet.e2b_status(u, grant) == 404
        checks[f"{m} proxy"] = lambda u=proxies[m]: kube_fleet.proxy_status(u, grant) == 502
        checks[f"{m} watch"] = lambda w=watches[m]: w.first("DELETED", "doomed") is not None
    try:
        kube_fleet.nodes["victim"].publisher.kill()
        killed = time.monotonic()
        obj = kube_fleet.inventory("victim")
        assert obj is not None
        # The last publish, on this machine's monotonic clock (stamps have whole seconds).
        age = (datetime.now(UTC) - parse_rfc3339(obj["publishedAt"])).total_seconds()
        last_publish = killed - age
        times = first_times(checks, STALE_AFTER + INTERVAL + PRECISION + TICK + 3)
        for m in modes:  # the watch's own arrival time, not when the poll looked
            times[f"{m} watch"] = watches[m].first("DELETED", "doomed") or times[f"{m} watch"]
    finally:
        for watch in watches.values():
            watch.close()
    for what, when in times.items():
        tick = TICK if what.startswith("extrapolate") else INTERVAL
        upper = STALE_AFTER + tick + PRECISION + TICK
        # Slack for delivery: every publish reaches the readers through kube-apiserver's
        # watch, which on a busy 2-core machine takes up to several hundred ms.
        assert STALE_AFTER - PRECISION < when - last_publish <= upper + DELIVERY, (
            what,
            when - last_publish,
        )


@pytest.mark.parametrize("outage", ["kube-apiserver", "etcd"])
def test_a_control_plane_outage_keeps_every_node_and_claims_working(
    kube_fleet: KubeFleet, outage: str
) -> None:
    for name in ("node-a", "node-b", "node-c"):
        kube_fleet.add_node(name, pool=2)
    kube_url, e2b_url = kube_fleet.add_apiserver()
    kube_fleet.ready()
    for name in kube_fleet.nodes:
        kube_fleet.claim_on(name, f"default/on-{name}")
    everyone = {f"on-{name}" for name in kube_fleet.nodes}
    wait_until(
        lambda: everyone <= kube_fleet.listed(kube_url), timeout=15, what="every node listed"
    )
    # "Two minutes" in compressed time: three windows with the control plane away.
    # Without etcd, kube-apiserver still answers (errors and timeouts) and keeps its
    # readers' watches open; without kube-apiserver, nothing answers at all.
    stop, start = {
        "kube-apiserver": (kube_fleet.plane.stop_apiserver, kube_fleet.plane.start_apiserver),
        "etcd": (kube_fleet.plane.stop_etcd, kube_fleet.plane.start_etcd),
    }[outage]
    stop()
    outage_end = time.monotonic() + 3 * STALE_AFTER
    created = []
    while time.monotonic() < outage_end:
        assert everyone <= kube_fleet.listed(kube_url)
        if len(created) < 2:
            answer = httpx.post(
                f"{e2b_url}/sandboxes",
                json={"templateID": "base", "timeout": 60},
                headers={"X-API-Key": E2B_KEY},
                timeout=15,
            )
            assert answer.status_code == 201, answer.text
            created.append(answer.json()["sandboxID"])
        time.sleep(0.2)
    start()
    # Publishes resume one by one: nobody is dropped meanwhile (stall credit).
    recovered = time.monotonic() + 3 * INTERVAL + STALE_AFTER
    while time.monotonic() < recovered:
        assert everyone <= kube_fleet.listed(kube_url)
        time.sleep(0.2)
    assert len(created) == 2


def test_a_clock_an_hour_ahead_evicts_nobody(kube_fleet: KubeFleet) -> None:
    kube_fleet.add_node("node-a")
    kube_fleet.add_node("node-b")
    kube_url, _ = kube_fleet.add_apiserver()
    kube_fleet.ready()
    for name in ("node-a", "node-b"):
        kube_fleet.claim_on(name, f"default/on-{name}")
    wait_until(
        lambda: {"on-node-a", "on-node-b"} <= kube_fleet.listed(kube_url), timeout=15, what="both"
    )
    # node-b's publisher is replaced by one whose clock runs an hour ahead.
    node = kube_fleet.nodes["node-b"]
    node.publisher.stop()
    agent = AgentClient(node.address, ROOT_TOKEN)
    api = api_client(kube_fleet.identities.publisher)
    skewed = Publisher(
        "node-b",
        agent,
        CustomObjects(api, NODE_INVENTORIES),
        interval=timedelta(seconds=INTERVAL),
        clock=_Ahead(timedelta(hours=1)),
    )
    publishing = Background(skewed)
    publishing.start()
    try:
        wait_until(
            lambda: _stamp_ahead(kube_fleet, "node-b"), what="node-b's stamp to be an hour ahead"
        )
        until = time.monotonic() + STALE_AFTER + 3 * INTERVAL
        while time.monotonic() < until:
            assert {"on-node-a", "on-node-b"} <= kube_fleet.listed(kube_url)
            time.sleep(0.2)
    finally:
        publishing.stop()
        agent.close()
        api.close()


class _Ahead(SystemClock):
    def __init__(self, by: timedelta) -> None:
        self._by = by

    def now(self) -> datetime:
        return super().now() + self._by


def _stamp_ahead(fleet: KubeFleet, name: str) -> bool:
    obj = fleet.inventory(name)
    if obj is None or "publishedAt" not in obj:
        return False
    return parse_rfc3339(obj["publishedAt"]) > datetime.now(UTC) + timedelta(minutes=59)

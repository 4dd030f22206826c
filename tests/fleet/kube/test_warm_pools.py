"""The warm-pool driver in real ``serve-apiserver`` processes: pools follow the
SandboxWarmPool objects; a single replica that loses its Lease in a control-plane
outage stops driving and keeps serving; a second replica takes over when the leader dies.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from sandboxctl.agentapi import AgentClient
from sandboxctl.core.model import PoolKey
from tests.fleet.kube.fleet import (
    E2B_KEY,
    ROOT_TOKEN,
    KubeFleet,
    skip_reason,
)
from tests.sandboxd.servers import wait_until

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))
EXT = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default"
LEASE = "/apis/coordination.k8s.io/v1/namespaces/sandbox-system/leases/sandboxctl-warm-pool-driver"
DRIVER = (
    "--leader-election-namespace",
    "sandbox-system",
    "--leader-election-lease-duration",
    "2s",
    "--leader-election-renew-deadline",
    "1500ms",
    "--leader-election-retry-period",
    "300ms",
    "--warm-pool-sync-interval",
    "500ms",
)
BASE = PoolKey("base")


def create(fleet: KubeFleet, plural: str, body: dict[str, Any]) -> None:
    with fleet.plane.http() as http:
        answer = http.post(f"{EXT}/{plural}", json=body)
    assert answer.status_code == 201, answer.text


def warm_pool(fleet: KubeFleet, replicas: int) -> None:
    template = {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "base"}]}}}
    create(
        fleet,
        "sandboxtemplates",
        {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxTemplate",
            "metadata": {"name": "base"},
            "spec": template,
        },
    )
    create(
        fleet,
        "sandboxwarmpools",
        {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxWarmPool",
            "metadata": {"name": "base"},
            "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": "base"}},
        },
    )


def set_replicas(fleet: KubeFleet, replicas: int) -> None:
    with fleet.plane.http() as http:
        answer = http.patch(
            f"{EXT}/sandboxwarmpools/base",
            json={"spec": {"replicas": replicas}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
    assert answer.status_code == 200, answer.text


def targets(fleet: KubeFleet) -> dict[str, int]:
    out = {}
    for name, node in fleet.nodes.items():
        with AgentClient(node.address, ROOT_TOKEN) as agent:
            out[name] = sum(p.target for p in agent.info().pools if p.key == BASE)
    return out


def holder(fleet: KubeFleet) -> str:
    with fleet.plane.http() as http:
        answer = http.get(LEASE)
    return (
        str(answer.json()["spec"].get("holderIdentity") or "") if answer.status_code == 200 else ""
    )


def test_pools_follow_the_objects_and_a_lone_replica_survives_losing_its_lease(
    kube_fleet: KubeFleet,
) -> None:
    kube_fleet.add_node("node-a", pool=0)
    kube_fleet.add_node("node-b", pool=0)
    _, e2b_url = kube_fleet.add_apiserver(*DRIVER)
    kube_fleet.ready()
    warm_pool(kube_fleet, 3)
    wait_until(
        lambda: targets(kube_fleet) == {"node-a": 2, "node-b": 1}, timeout=20, what="pools set"
    )
    apiserver = kube_fleet.apiservers[0][0]
    wait_until(lambda: "warm-pool driver started" in apiserver.output(), what="the driver")
    # The control plane goes away: the lease cannot be renewed, the driver stops, and
    # the replica goes on serving claims from its cache.
    kube_fleet.plane.stop_apiserver()
    wait_until(
        lambda: "warm-pool driver stopped" in apiserver.output(),
        timeout=10,
        what="the driver to stop",
    )
    # Counted now: a real kube-apiserver serves the Lease before its /readyz says ready,
    # so the driver may lead again before start_apiserver returns.
    started = apiserver.output().count("warm-pool driver started")
    answer = httpx.post(
        f"{e2b_url}/sandboxes",
        json={"templateID": "base", "timeout": 60},
        headers={"X-API-Key": E2B_KEY},
        timeout=15,
    )
    assert answer.status_code == 201, answer.text
    assert apiserver.running
    kube_fleet.plane.start_apiserver()
    wait_until(
        lambda: apiserver.output().count("warm-pool driver started") > started,
        timeout=15,
        what="the driver to campaign again and lead",
    )
    set_replicas(kube_fleet, 4)
    wait_until(
        lambda: targets(kube_fleet) == {"node-a": 2, "node-b": 2}, timeout=20, what="new pools"
    )


def test_failover_between_two_replicas(kube_fleet: KubeFleet) -> None:
    kube_fleet.add_node("node-a", pool=0)
    kube_fleet.add_node("node-b", pool=0)
    kube_fleet.add_apiserver(*DRIVER)
    kube_fleet.add_apiserver(*DRIVER)
    kube_fleet.ready()
    warm_pool(kube_fleet, 2)
    wait_until(
        lambda: targets(kube_fleet) == {"node-a": 1, "node-b": 1}, timeout=20, what="pools set"
    )
    leader_identity = holder(kube_fleet)
    leader = next(p for p, *_ in kube_fleet.apiservers if f"_{p.popen.pid}_" in leader_identity)  # type: ignore[union-attr]
    follower = next(p for p, *_ in kube_fleet.apiservers if p is not leader)
    leader.kill()  # no hand-over: the follower waits out the lease
    killed = time.monotonic()
    wait_until(
        lambda: holder(kube_fleet) not in ("", leader_identity), timeout=15, what="a new holder"
    )
    assert time.monotonic() - killed >= 1.0  # it waited for the lease to run out
    assert f"_{follower.popen.pid}_" in holder(kube_fleet)  # type: ignore[union-attr]
    set_replicas(kube_fleet, 6)
    wait_until(
        lambda: targets(kube_fleet) == {"node-a": 3, "node-b": 3},
        timeout=20,
        what="the new leader drives",
    )

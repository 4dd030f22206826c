"""The warm-pool driver against the real control plane, with agent stand-ins that record PUT
/v1/pools: one tick's full sets and statuses, unresolvable templates, a failing node,
fail-closed without a token, and the driver running only under its Lease."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client

from sandboxctl.agentapi import AgentInfo, AgentUnreachable, PoolTarget
from sandboxctl.apiserver.warmpool import DriverLease, DriverSettings, WarmPoolDriver
from sandboxctl.clock import ManualClock
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.model import NodeInventory, Pool, PoolKey
from sandboxctl.inventory.memory import MemoryInventorySource
from sandboxctl.lifecycle import EXIT_STOPPED, Group, Manager
from sandboxctl.store import SandboxStore
from tests.fleet.kube.identities import ensure_namespace
from tests.lifecycle.managed import Managed
from tests.sandboxd.servers import wait_until
from tests.testing.realkube import RealKube as Kube

G, V = "extensions.agents.x-k8s.io", "v1beta1"
FAST = DriverSettings(interval=timedelta(seconds=0.2))
T0 = datetime(2026, 11, 30, 4, 0, tzinfo=UTC)
BASE = PoolKey("base")
PY = PoolKey("python", "egress", "medium")


class StandIns:
    """One stand-in agent per address: records every PUT and answers with warm = target."""

    def __init__(self) -> None:
        self.puts: dict[str, list[tuple[tuple[PoolKey, int], ...]]] = {}
        self.down: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, address: str) -> StandIns.Agent:
        return StandIns.Agent(self, address)

    class Agent:
        def __init__(self, owner: StandIns, address: str) -> None:
            self.owner, self.address = owner, address

        def __enter__(self) -> StandIns.Agent:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def set_pools(self, pools: list[PoolTarget]) -> AgentInfo:
            if self.address in self.owner.down:
                raise AgentUnreachable(self.address, "connection refused", undelivered=True)
            with self.owner._lock:
                self.owner.puts.setdefault(self.address, []).append(
                    tuple((p.key, p.warm) for p in pools)
                )
            return AgentInfo.from_json(
                {
                    "node": self.address,
                    "advertise_addr": self.address,
                    "pools": [
                        {
                            "key": {
                                "template": p.key.template,
                                "net": p.key.net,
                                "size": p.key.size,
                            },
                            "warm": p.warm,
                            "target": p.warm,
                        }
                        for p in pools
                    ],
                }
            )


def objects(kube: Kube) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube.api)


def add_template(kube: Kube, name: str, image: str, net: str = "", cpu: str = "") -> None:
    pod: dict[str, Any] = {"spec": {"containers": [{"name": "main", "image": image}]}}
    if net:
        pod["metadata"] = {"annotations": {"sandbox.cocoonstack.io/net": net}}
    if cpu:
        pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu}}
    body = {
        "apiVersion": f"{G}/{V}",
        "kind": "SandboxTemplate",
        "metadata": {"name": name},
        "spec": {"podTemplate": pod},
    }
    objects(kube).create_namespaced_custom_object(G, V, "default", "sandboxtemplates", body)


def add_pool(kube: Kube, name: str, template: str, replicas: int | None) -> None:
    spec: dict[str, Any] = {"sandboxTemplateRef": {"name": template}}
    if replicas is not None:
        spec["replicas"] = replicas
    body = {
        "apiVersion": f"{G}/{V}",
        "kind": "SandboxWarmPool",
        "metadata": {"name": name},
        "spec": spec,
    }
    objects(kube).create_namespaced_custom_object(G, V, "default", "sandboxwarmpools", body)


def pool_status(kube: Kube, name: str) -> dict[str, Any]:
    obj = objects(kube).get_namespaced_custom_object(G, V, "default", "sandboxwarmpools", name)
    return obj.get("status") or {}  # type: ignore[no-any-return]


@pytest.fixture
def fleet() -> tuple[SandboxStore, MemoryInventorySource, ManualClock]:
    clock = ManualClock(T0)
    nodes = [
        NodeInventory(
            node=n, address=f"{n}:7777", pools=(Pool(BASE, warm=1, target=1),), published_at=T0
        )
        for n in ("n-a", "n-b", "n-c")
    ]
    nodes.append(
        NodeInventory(node="stale", address="stale:7777", published_at=T0 - timedelta(minutes=10))
    )
    source = MemoryInventorySource(nodes, clock=clock)
    return SandboxStore(source, FreshnessRule(), clock=clock), source, clock


@pytest.fixture
def driver(
    kube: Kube, fleet: tuple[SandboxStore, MemoryInventorySource, ManualClock]
) -> Iterator[tuple[WarmPoolDriver, StandIns, Managed]]:
    agents = StandIns()
    one = WarmPoolDriver(kube.api, fleet[0], "root-token", FAST, agent_factory=agents)
    managed = Managed(one)
    yield one, agents, managed
    managed.stop()


def test_a_tick_spreads_pools_and_writes_status(
    kube: Kube, driver: tuple[WarmPoolDriver, StandIns, Managed]
) -> None:
    one, agents, managed = driver
    add_template(kube, "base", "base")
    add_template(kube, "py", "python", net="egress", cpu="2")
    add_pool(kube, "small", "base", 4)
    add_pool(kube, "py", "py", None)  # replicas defaults to 1
    add_pool(kube, "broken", "missing", 3)
    managed.start()
    wait_until(lambda: one.ticks >= 1 and pool_status(kube, "broken"), what="a tick with statuses")
    last = {address: puts[-1] for address, puts in agents.puts.items()}
    assert last == {
        "n-a:7777": ((BASE, 2), (PY, 1)),
        "n-b:7777": ((BASE, 1),),
        "n-c:7777": ((BASE, 1),),
    }  # the stale node gets nothing
    assert pool_status(kube, "small") == {
        "replicas": 4,
        "readyReplicas": 4,
        "selector": "agents.x-k8s.io/warm-pool=small",
    }
    assert pool_status(kube, "py")["readyReplicas"] == 1
    assert pool_status(kube, "broken")["readyReplicas"] == 0


def test_a_failing_node_keeps_its_inventory_count_and_the_rest_go_on(
    kube: Kube, driver: tuple[WarmPoolDriver, StandIns, Managed]
) -> None:
    one, agents, managed = driver
    add_template(kube, "base", "base")
    add_pool(kube, "small", "base", 3)
    agents.down.add("n-b:7777")
    managed.start()
    wait_until(lambda: one.last is not None, what="a tick")
    assert one.last is not None
    assert one.last.put_failures == 1
    assert set(agents.puts) == {"n-a:7777", "n-c:7777"}
    assert pool_status(kube, "small")["readyReplicas"] == 1 + 1 + 1  # n-b's listed warm count


def test_without_a_token_no_pools_are_set(
    kube: Kube, fleet: tuple[SandboxStore, MemoryInventorySource, ManualClock]
) -> None:
    agents = StandIns()
    add_template(kube, "base", "base")
    add_pool(kube, "small", "base", 3)
    one = WarmPoolDriver(kube.api, fleet[0], None, FAST, agent_factory=agents)
    managed = Managed(one)
    managed.start()
    try:
        wait_until(lambda: one.ticks >= 2, what="two ticks")
    finally:
        managed.stop()
    assert agents.puts == {}


class Replica:
    """One serve-apiserver's process manager, with the driver as its leader-elected part."""

    def __init__(self, kube: Kube, store: SandboxStore, identity: str) -> None:
        settings = DriverSettings(
            interval=timedelta(seconds=0.2),
            lease_namespace="sandbox-system",
            identity=identity,
            lease_duration=timedelta(seconds=1.5),
            renew_deadline=timedelta(seconds=1),
            retry_period=timedelta(seconds=0.2),
            rejoin_after=timedelta(seconds=0.3),
        )
        self.driver = WarmPoolDriver(kube.api, store, "t", settings, agent_factory=StandIns())
        self.manager = Manager(election=DriverLease(kube.api, settings))
        self.manager.add(self.driver, Group.LEADER_ELECTED)
        self.codes: list[int] = []
        self._thread = threading.Thread(target=lambda: self.codes.append(self.manager.run()))
        self._thread.start()

    @property
    def driving(self) -> bool:
        return self.driver.running and self.driver.ticks > 0

    def stop(self) -> None:
        self.manager.stop()
        self._thread.join(timeout=15)


def test_only_the_lease_holder_drives(
    kube: Kube, fleet: tuple[SandboxStore, MemoryInventorySource, ManualClock]
) -> None:
    # A Lease lives in a namespace that must exist (the double took any).
    ensure_namespace(kube.api, "sandbox-system")
    replicas = [Replica(kube, fleet[0], name) for name in ("one", "two")]
    try:
        wait_until(lambda: any(r.driving for r in replicas), what="a driver")
        driving = [r for r in replicas if r.driving]
        assert len(driving) == 1
        driving[0].stop()
        assert driving[0].codes == [EXIT_STOPPED]
        assert not driving[0].driving
        other = next(r for r in replicas if r is not driving[0])
        wait_until(lambda: other.driving, timeout=10, what="the other replica's driver")
    finally:
        for replica in replicas:
            replica.stop()

"""The kube inventory source against the double: each informer event replaces or removes
one node, an unreadable object keeps the node's last inventory, and a missing CRD fails
the start in one line."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from kubernetes import client

from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.model import Entry, NodeInventory, Pool, PoolKey
from sandboxctl.inventory import InventorySource
from sandboxctl.inventory.kube import KubeInventorySource, KubeStartError
from sandboxctl.publisher import published_object
from sandboxctl_testing.kubeapi import start
from tests.sandboxd.servers import wait_until
from tests.testing.kubeapi.double import (
    Kube,
    api_for,
)

NI = ("sandbox.cocoonstack.io", "v1beta1", "nodeinventories")
T0 = datetime(2026, 11, 30, 4, 0, tzinfo=UTC)


def inventory(node: str, *names: str, at: datetime = T0) -> NodeInventory:
    return NodeInventory(
        node=node,
        address=f"{node}.invalid:7777",
        pools=(Pool(PoolKey("base"), warm=1, target=1),),
        entries=tuple(Entry(name=n, phase="Running", id=f"sb_{n}") for n in names),
        published_at=at,
    )


def put(kube: Kube, inv: NodeInventory) -> None:
    client.CustomObjectsApi(kube.api).patch_cluster_custom_object(
        *NI,
        inv.node,
        published_object(inv),
        field_manager="test",
        force=True,
        _content_type="application/apply-patch+yaml",
    )


@pytest.fixture
def source(kube: Kube) -> Iterator[KubeInventorySource]:
    put(kube, inventory("n1", "a"))
    one = KubeInventorySource(kube.api, stall_after=timedelta(seconds=30))
    one.start()
    yield one
    one.stop()


def nodes(source: KubeInventorySource) -> dict[str, tuple[str, ...]]:
    snapshot = source.snapshot()
    return {n: tuple(e.name for e in snapshot.record(n).inventory.entries) for n in snapshot.nodes}  # type: ignore[union-attr]


def test_it_is_an_inventory_source(source: KubeInventorySource) -> None:
    assert isinstance(source, InventorySource)
    assert nodes(source) == {"n1": ("a",)}
    view = source.snapshot().view(FreshnessRule(), T0 + timedelta(seconds=10))
    assert view.fresh_nodes() == ["n1"]


def test_each_event_replaces_or_removes_one_node(source: KubeInventorySource, kube: Kube) -> None:
    before = source.snapshot()
    put(kube, inventory("n2", "b", "c"))
    wait_until(lambda: "n2" in source.snapshot().nodes, what="n2")
    after = source.snapshot()
    assert after.record("n1") is before.record("n1")  # n1's record is shared, not rebuilt
    put(kube, inventory("n1", "a", "d", at=T0 + timedelta(seconds=30)))
    wait_until(lambda: nodes(source).get("n1") == ("a", "d"), what="n1's new entries")
    assert source.snapshot().newest == T0 + timedelta(seconds=30)
    client.CustomObjectsApi(kube.api).delete_cluster_custom_object(*NI, "n2")
    wait_until(lambda: "n2" not in source.snapshot().nodes, what="n2 to go")
    assert nodes(source) == {"n1": ("a", "d")}


def test_a_republish_reuses_unchanged_entries(source: KubeInventorySource, kube: Kube) -> None:
    put(kube, inventory("n1", "a", "b", "c"))
    wait_until(lambda: nodes(source).get("n1") == ("a", "b", "c"), what="three entries")
    before = source.snapshot().record("n1").inventory.entries  # type: ignore[union-attr]
    changed = inventory("n1", "a", "b", "c", "d", at=T0 + timedelta(seconds=30))
    changed = dataclasses.replace(
        changed,
        entries=(
            changed.entries[0],
            msgspec.structs.replace(changed.entries[1], phase="Hibernated"),
            *changed.entries[2:],
        ),
    )
    put(kube, changed)
    wait_until(lambda: nodes(source).get("n1") == ("a", "b", "c", "d"), what="four entries")
    after = source.snapshot().record("n1").inventory.entries  # type: ignore[union-attr]
    assert after == changed.entries  # the same values as a full read gives
    assert after[0] is before[0]  # unchanged: reused
    assert after[2] is before[2]
    assert after[1] is not before[1]  # changed: read again
    # Two entries under one name and id: read whole, nothing reused wrongly.
    again = msgspec.structs.replace(changed.entries[0], phase="Gone")
    twice = dataclasses.replace(changed, entries=(*changed.entries, again))
    put(kube, twice)
    wait_until(lambda: len(nodes(source)["n1"]) == 5, what="five entries")
    assert source.snapshot().record("n1").inventory.entries == twice.entries  # type: ignore[union-attr]


def test_an_unreadable_object_keeps_the_last_inventory(
    source: KubeInventorySource, kube: Kube
) -> None:
    events = source.events
    # Valid for the schema, not for the model: node differs from the object's name.
    client.CustomObjectsApi(kube.api).patch_cluster_custom_object(*NI, "n1", {"node": "other"})
    wait_until(lambda: source.informer.stats.events >= 2, what="the event")
    assert source.events == events
    assert nodes(source) == {"n1": ("a",)}


def test_a_missing_crd_fails_the_start_in_one_line() -> None:
    bare = start(0)  # no CRDs registered
    try:
        api = api_for(bare.url)
        one = KubeInventorySource(api, sync_timeout=timedelta(seconds=1), backoff_max=0.2)
        with pytest.raises(KubeStartError) as failed:
            one.start()
        message = str(failed.value)
        assert "is the CRD installed" in message
        assert "404" in message or "not find" in message
        assert "\n" not in message
    finally:
        bare.stop()

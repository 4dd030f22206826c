"""The owners a store remembers: one policy (bounded, forgotten on release, on a node's
404, and on an inventory change that drops the sandbox), shared by every API."""

from __future__ import annotations

import time

from sandboxctl.clock import ManualClock
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.ids import SandboxId
from sandboxctl.core.snapshot import NodeRecord
from sandboxctl.inventory.memory import MemoryInventorySource
from sandboxctl.store import SandboxStore
from sandboxctl.store.owners import Owner, Owners
from tests.store.inventories import T0, entry, node

ID = SandboxId.of_claim("sb_x")


def _record(*claim_ids: str) -> NodeRecord:
    return NodeRecord(node("a", *(entry(f"default/{c}", claim_id=c) for c in claim_ids)))


def test_it_is_bounded_least_recently_used_first() -> None:
    owners = Owners(capacity=2)
    for claim_id in ("sb_1", "sb_2"):
        owners.remember(Owner("a", "a:1", claim_id), SandboxId.of_claim(claim_id))
    assert owners.get(SandboxId.parse("sb-1")) is not None  # used: sb_2 is now the oldest
    owners.remember(Owner("a", "a:1", "sb_3"), SandboxId.of_claim("sb_3"))
    assert len(owners) == 2
    assert owners.get(SandboxId.of_claim("sb_2")) is None
    assert owners.get(SandboxId.of_claim("sb_1")) is not None


def test_an_inventory_change_drops_what_it_no_longer_lists() -> None:
    owners = Owners()
    owners.remember(Owner("a", "a:1", "sb_x", listed=True), ID, ("default", "x"))
    owners.nodes_changed([("a", _record("sb_x", "sb_y"))])
    assert owners.get(ID) is not None
    owners.nodes_changed([("a", _record("sb_y"))])
    assert owners.get(ID) is None
    assert owners.get(("default", "x")) is None


def test_an_owner_not_listed_yet_stays_until_its_node_lists_it_then_drops_it() -> None:
    owners = Owners()
    owners.remember(Owner("a", "a:1", "sb_x"), ID)  # a claim since the last publish
    owners.nodes_changed([("a", _record("sb_y"))])
    assert owners.get(ID) is not None
    owners.nodes_changed([("a", _record("sb_x"))])
    owners.nodes_changed([("a", _record())])
    assert owners.get(ID) is None


def test_an_owner_no_inventory_listed_expires_and_a_listed_one_does_not() -> None:
    now = [0.0]
    owners = Owners(clock=lambda: now[0], unlisted_for=90.0)
    owners.remember(Owner("a", "a:1", "sb_x"), ID)  # unlisted: released before a publish?
    owners.remember(Owner("a", "a:1", "sb_y"), SandboxId.of_claim("sb_y"))
    owners.remember(Owner("a", "a:1", "sb_z", listed=True), SandboxId.of_claim("sb_z"))
    now[0] = 60.0
    owners.nodes_changed([("a", _record("sb_y", "sb_z"))])  # its node lists sb_y now
    assert owners.get(ID) is not None
    now[0] = 90.0
    assert owners.get(ID) is None
    listed_since = owners.get(SandboxId.of_claim("sb_y"))
    assert listed_since is not None
    assert listed_since.listed
    assert owners.get(SandboxId.of_claim("sb_z")) is not None
    assert len(owners) == 2


def test_a_node_gone_stale_or_left_drops_its_owners() -> None:
    owners = Owners()
    owners.remember(Owner("a", "a:1", "sb_x"), ID)
    owners.remember(Owner("b", "b:1", "sb_z"), SandboxId.of_claim("sb_z"))
    owners.nodes_changed([("a", None)])
    assert owners.get(ID) is None
    assert owners.get(SandboxId.of_claim("sb_z")) is not None


def test_the_store_forgets_an_owner_when_the_source_drops_the_sandbox() -> None:
    clock = ManualClock(T0)
    source = MemoryInventorySource([node("a", entry("default/x", claim_id="sb_x"))], clock=clock)
    store = SandboxStore(source, FreshnessRule(), clock=clock)
    try:
        assert store.locate_claim(ID) is not None
        store.resolver.owners.remember(Owner("a", "a.fleet.test:7777", "sb_x", listed=True), ID)
        source.apply(node("a"))  # the notification alone applies it: no read in between
        deadline = time.monotonic() + 5  # on the reads' syncer thread, soon after
        while store.resolver.owners.get(ID) is not None:
            assert time.monotonic() < deadline, "the owner was not forgotten"
            time.sleep(0.005)
    finally:
        store.close()

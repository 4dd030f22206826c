"""Two e2b API replicas over the same agents: a sandbox created through one is read through
the other at once, before any publish shows it there (the other asks the agents live, by
their spelling of the id)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from datetime import timedelta

import httpx
import pytest

from sandboxctl.apiserver.e2b import create_e2b_app
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.ids import SandboxId
from sandboxctl.inventory.mesh import MeshInventorySource
from sandboxctl.store import SandboxStore
from sandboxctl.store.nodes import NodeAccess
from tests.apiserver.e2b.stack import KEY_A, TOKEN, Stack
from tests.apiserver.helpers import serving
from tests.sandboxd.servers import wait_until


@pytest.fixture
def replica(stack: Stack) -> Iterator[tuple[SandboxStore, str]]:
    """A second store and e2b app over the stack's agents that polls them once only, so
    it never sees a later create in an inventory."""
    addresses = [agent.settings.advertise_addr for agent in stack.agents.values()]
    with ExitStack() as resources:
        source = MeshInventorySource(addresses, TOKEN, poll_interval=timedelta(hours=1))
        source.start()
        resources.callback(source.stop)
        store = SandboxStore(source, FreshnessRule(), nodes=NodeAccess(TOKEN))
        resources.callback(store.close)
        wait_until(lambda: len(store.fresh_nodes()) == len(stack.agents), what="the replica's poll")
        yield store, resources.enter_context(serving(create_e2b_app(store, stack.config)))


def test_a_read_on_another_replica_right_after_a_create_finds_it(
    stack: Stack, replica: tuple[SandboxStore, str]
) -> None:
    other, other_url = replica
    headers = {"X-API-Key": KEY_A}
    with (
        httpx.Client(base_url=stack.api_url, headers=headers, timeout=30) as first,
        httpx.Client(base_url=other_url, headers=headers, timeout=30) as second,
    ):
        created = first.post("/sandboxes", json={"templateID": "base", "timeout": 60})
        assert created.status_code == 201, created.text
        sandbox_id, owner = created.json()["sandboxID"], created.json()["clientID"]
        try:
            # the replica has not seen it: only a live ask can find it
            assert other.locate_claim(SandboxId.parse(sandbox_id), ask_nodes=False) is None
            read = second.get(f"/sandboxes/{sandbox_id}")
            assert read.status_code == 200, read.text
            assert (read.json()["sandboxID"], read.json()["clientID"]) == (sandbox_id, owner)

            # found once, it is the owner's alone to ask (the owning-node index)
            before = dict(other.stats.live_asks)
            assert second.get(f"/sandboxes/{sandbox_id}").status_code == 200
            asked = {a: n - before.get(a, 0) for a, n in other.stats.live_asks.items()}
            assert {a: n for a, n in asked.items() if n} == {other.address(owner): 1}
        finally:
            first.delete(f"/sandboxes/{sandbox_id}")

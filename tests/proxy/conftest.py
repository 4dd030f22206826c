"""A static fleet for the envd proxy: two fresh nodes and one stale node, each node's
address a stand-in agent (tests/proxy/standin.py) that counts what it receives."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from sandboxctl.apiserver.e2b.models import envd_access_token
from sandboxctl.clock import ManualClock
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.model import Entry, NodeInventory
from sandboxctl.inventory.memory import MemoryInventorySource
from sandboxctl.proxy import create_proxy_app
from sandboxctl.store import SandboxStore
from sandboxctl.store.nodes import NodeAccess
from tests.apiserver.helpers import serving
from tests.cli.conftest import run  # noqa: F401  (the in-process CLI fixture)
from tests.conftest import process_slot
from tests.proxy.sdk_stack import sdk_stack, skip_reason
from tests.proxy.standin import StandIn

FLEET_TOKEN = "fleet-root-token"
SECRET = b"envd-secret-for-proxy-tests"
DOMAIN = "sandboxes.test"
LISTED = "sb_0a0a0a0a"  # in node-a's inventory
UNLISTED = "sb_0b0b0b0b"  # on node-b, not yet in its inventory: found by a probe
UNLISTED_2 = "sb_0b0b0b0c"
STALE = "sb_05050505"  # in the stale node's inventory
TOKENS = {
    LISTED: "claim-token-a",
    UNLISTED: "claim-token-b",
    UNLISTED_2: "claim-token-b2",
    STALE: "claim-token-stale",
}


SDK_KEY = "e2b_" + "c" * 40
SDK_SECRET = b"envd-secret-for-proxy-sdk-tests"
SDK_UID_BASE = 2_000_000 + process_slot() * 20  # one node: warm + 7 sandboxes


@pytest.fixture(scope="session")
def sdk() -> Iterator[dict[str, Any]]:
    """The real one-node stack (tests/proxy/sdk_stack.py) that test_sdk and
    test_sdk_hardening drive the unmodified e2b SDK through, started once for both: each
    test creates the sandboxes it uses and kills them. Its connection parameters."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with sdk_stack(
        key=SDK_KEY,
        secret=SDK_SECRET,
        uid_base=SDK_UID_BASE,
        warm=2,
        prefix="sandboxctl-proxy-sdk-",
    ) as params:
        yield params


def access(claim_id: str) -> str:
    return envd_access_token(SECRET, TOKENS[claim_id])


def public(claim_id: str) -> str:
    return claim_id.replace("_", "-")


@dataclass
class Fleet:
    standins: dict[str, StandIn]
    store: SandboxStore
    source: MemoryInventorySource

    def proxy(self, **options: Any) -> Any:
        return create_proxy_app(self.store, SECRET, DOMAIN, **options)


def _entry(claim_id: str) -> Entry:
    return Entry(name=f"default/{claim_id}", phase="Running", id=claim_id)


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with ExitStack() as stack:
        standins = {
            "node-a": StandIn(FLEET_TOKEN, {LISTED: TOKENS[LISTED]}),
            "node-b": StandIn(
                FLEET_TOKEN, {UNLISTED: TOKENS[UNLISTED], UNLISTED_2: TOKENS[UNLISTED_2]}
            ),
            "node-stale": StandIn(FLEET_TOKEN, {STALE: TOKENS[STALE]}),
        }
        urls = {node: stack.enter_context(serving(app)) for node, app in standins.items()}
        now = datetime.now(UTC)
        inventories = [
            NodeInventory("node-a", _address(urls["node-a"]), entries=(_entry(LISTED),)),
            NodeInventory("node-b", _address(urls["node-b"])),
            NodeInventory("node-stale", _address(urls["node-stale"]), entries=(_entry(STALE),)),
        ]
        stamped = [
            NodeInventory(
                i.node,
                i.address,
                entries=i.entries,
                published_at=now - timedelta(hours=1) if i.node == "node-stale" else now,
            )
            for i in inventories
        ]
        source = MemoryInventorySource(stamped)
        store = SandboxStore(
            source, FreshnessRule(timedelta(seconds=90)), nodes=NodeAccess(FLEET_TOKEN)
        )
        stack.callback(store.close)
        assert store.fresh_nodes() == ["node-a", "node-b"]
        yield Fleet(standins, store, source)


def _address(url: str) -> str:
    return url.removeprefix("http://")


@pytest.fixture
def proxy_url(fleet: Fleet) -> Iterator[str]:
    with serving(fleet.proxy()) as url:
        yield url


@pytest.fixture
def client(proxy_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=proxy_url, timeout=httpx.Timeout(15.0)) as http:
        yield http


Headers = Callable[..., dict[str, str]]


@pytest.fixture
def sdk_headers() -> Headers:
    def make(
        claim_id: str = LISTED, port: str = "49983", token: str | None = None
    ) -> dict[str, str]:
        return {
            "E2b-Sandbox-Id": public(claim_id),
            "E2b-Sandbox-Port": port,
            "X-Access-Token": access(claim_id) if token is None else token,
        }

    return make


@pytest.fixture
def clock() -> ManualClock:
    """Time the proxy's budget, owner cache and direct-guest memory read; moved by hand."""
    return ManualClock(datetime(2026, 11, 30, tzinfo=UTC), monotonic=100.0)

"""The e2b API's routes are plain functions over the service: each one found by name in
the route table, served by the app, and callable without HTTP."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from sandboxctl.apiserver.e2b import E2bConfig, create_e2b_app
from sandboxctl.apiserver.e2b.bodies import NewSandbox
from sandboxctl.apiserver.e2b.models import listed_body
from sandboxctl.apiserver.e2b.routes import ROUTES, sandboxes, templates
from sandboxctl.apiserver.e2b.service import E2bError, E2bService
from sandboxctl.clock import ManualClock
from sandboxctl.core import wire
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.model import Entry, Metadata, NodeInventory, Pool, PoolKey
from sandboxctl.core.snapshot import Located
from sandboxctl.inventory.memory import MemoryInventorySource
from sandboxctl.store import SandboxStore

T0 = datetime(2026, 11, 30, 4, 0, tzinfo=UTC)
CONFIG = E2bConfig(domain="example.test", envd_secret=b"s", api_keys={"k": "default"})


@pytest.fixture
def service() -> E2bService:
    entry = Entry(
        name="default/one",
        phase="Running",
        id="sb_0001",
        template="base",
        claim_ref="default/one",
        metadata=Metadata({"team": "a"}),
        claimed_at=T0,
    )
    inventory = NodeInventory(
        node="n1",
        address="n1.invalid:7777",
        pools=(Pool(PoolKey("base"), warm=1, target=1),),
        entries=(entry,),
        published_at=T0,
    )
    source = MemoryInventorySource((inventory,), clock=ManualClock(T0))
    return E2bService(SandboxStore(source, FreshnessRule(), clock=ManualClock(T0)), CONFIG)


def body(response: Any) -> Any:
    return json.loads(response.body)


def test_every_route_in_the_table_is_served_as_it_says() -> None:
    app = create_e2b_app(SandboxStore(MemoryInventorySource(()), FreshnessRule()), CONFIG)
    served = {
        (method, route.path, route.endpoint)
        for route in app.routes
        for method in getattr(route, "methods", ())
    }
    assert {(m, p, f) for m, p, f in ROUTES} <= served
    assert all(f.__module__.startswith("sandboxctl.apiserver.e2b.routes.") for _, _, f in ROUTES)


def test_a_route_is_a_function_of_the_service_and_plain_values(service: E2bService) -> None:
    listed = asyncio.run(sandboxes.list_v2(service, "default", metadata="team=a", limit="1"))
    assert [item["sandboxID"] for item in body(listed)] == ["sb-0001"]
    assert body(listed)[0]["metadata"] == {"team": "a"}
    alias = asyncio.run(templates.template_alias(service, "default", "code-interpreter-v1"))
    assert body(alias) == {"templateID": "base", "public": True}


def test_a_route_refuses_with_the_apis_error(service: E2bService) -> None:
    with pytest.raises(E2bError) as refused:
        asyncio.run(sandboxes.create(service, "default", NewSandbox(templateID="nope")))
    assert (refused.value.status, refused.value.body()) == (
        404,
        {"code": 404, "message": "template 'nope' not found"},
    )


def test_a_listing_is_written_as_every_answer_is_whatever_its_times() -> None:
    """The list's fast writer (msgspec's own) gives encode's bytes: the times are made
    whole-second UTC first, whatever fraction or zone the entry and the clock carry."""
    zone = timezone(timedelta(hours=5, minutes=30))
    entries = [
        Entry(name="ns/a", phase="Running", id="sb_a1", template="base",
              claimed_at=datetime(2026, 12, 2, 5, 0, 1, 999_999, tzinfo=UTC),
              deadline=datetime(2026, 12, 2, 11, 0, 0, 500_000, tzinfo=zone),
              metadata=Metadata.of({"k": "é\u2028\x01"})),
        Entry(name="ns/b", phase="Hibernated", id="sb_b2", template="other"),
    ]  # fmt: skip
    now = datetime(2026, 12, 2, 5, 30, 0, 123_456, tzinfo=zone)
    config = E2bConfig(domain="test.invalid", envd_secret=b"s", api_keys={"k": "ns"})
    items = [listed_body(config, Located("node-a", entry), now) for entry in entries]
    assert wire.encode_listing(items) == wire.encode(items)
    assert b".999" not in wire.encode_listing(items)

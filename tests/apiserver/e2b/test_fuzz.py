"""A bounded fuzz pass, e2b side: schemathesis makes requests from
e2b's own OpenAPI document (``shared/reference/e2b-openapi.yml`` beside the checkout, or
``SANDBOXCTL_E2B_OPENAPI``) for every operation this server serves, valid and not, and no
answer may be a 5xx but the documented 502 (a node did not answer) and 503 (no capacity).

The fleet is one in-memory inventory whose node's address answers nothing, so every call
that reaches a node fails fast, as an unreachable node does: the API's own parsing and
checks are what is fuzzed. A few hundred requests, well under a minute."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from sandboxctl.apiserver.e2b import E2bConfig, create_e2b_app
from sandboxctl.apiserver.e2b.routes.unserved import UNSERVED
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.model import Entry, Metadata, NodeInventory, Pool, PoolKey
from sandboxctl.inventory.memory import MemoryInventorySource
from sandboxctl.store import SandboxStore
from sandboxctl.store.nodes import NodeAccess
from tests.apiserver.helpers import serving
from tests.sandboxd.servers import free_port

SPEC = Path(
    os.environ.get("SANDBOXCTL_E2B_OPENAPI")
    or Path(__file__).resolve().parents[4] / "shared" / "reference" / "e2b-openapi.yml"
)
KEY = "e2b_" + "f" * 40
ALLOWED_5XX = {502, 503}
EXAMPLES = 12  # per operation


def _served(app: Any) -> set[tuple[str, str]]:
    """(method, path with every parameter as ``{}``) of each route the app serves (not
    those that answer 501: test_unserved.py holds them)."""
    braces = re.compile(r"\{[^}]*\}")
    unserved = {(op.method, braces.sub("{}", op.path)) for op in UNSERVED}
    routed = {
        (method, braces.sub("{}", route.path))
        for route in app.routes
        for method in getattr(route, "methods", ())
        if method != "HEAD"
    }
    return routed - unserved


def _fleet() -> SandboxStore:
    now = datetime.now(UTC)
    nowhere = f"127.0.0.1:{free_port()}"  # nothing listens: every node call fails at once
    entries = tuple(
        Entry(
            name=f"default/s{n}",
            phase="Running",
            id=f"sb_{n:012x}",
            template="base",
            claim_ref=f"default/s{n}",
            addr=nowhere,
            deadline=now + timedelta(hours=1),
            claimed_at=now,
            metadata=Metadata.parse('{"a": "b"}'),
        )
        for n in range(3)
    )
    inventory = NodeInventory(
        node="n1",
        address=nowhere,
        pools=(Pool(PoolKey("base"), warm=2, target=2),),
        entries=entries,
        published_at=now,
    )
    source = MemoryInventorySource((inventory,))
    return SandboxStore(source, FreshnessRule(), nodes=NodeAccess("fleet-token"))


@pytest.fixture(scope="module")
def api() -> Iterator[tuple[Any, str]]:
    if not SPEC.is_file():
        pytest.skip(f"e2b's OpenAPI document is not at {SPEC} (set SANDBOXCTL_E2B_OPENAPI)")
    config = E2bConfig(domain="fuzz.test", envd_secret=b"fuzz", api_keys={KEY: "default"})
    app = create_e2b_app(_fleet(), config)
    served = _served(app)
    braces = re.compile(r"\{[^}]*\}")
    schema = schemathesis.openapi.from_path(SPEC).include(
        lambda ctx: (ctx.operation.method.upper(), braces.sub("{}", ctx.operation.path)) in served
    )
    with serving(app) as url:
        yield schema, url


def test_the_fuzz_covers_the_served_operations(api: tuple[Any, str]) -> None:
    schema, _ = api
    operations = {(op.ok().method.upper(), op.ok().path) for op in schema.get_all_operations()}
    assert ("POST", "/sandboxes") in operations
    assert ("GET", "/sandboxes/{sandboxID}") in operations
    assert len(operations) >= 10


def test_no_request_is_answered_with_an_undocumented_5xx(api: tuple[Any, str]) -> None:
    schema, url = api
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        strategy = operation.as_strategy()

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case: Any) -> None:
            response = case.call(base_url=url, headers={"X-API-Key": KEY}, timeout=10)
            if response.status_code >= 500 and response.status_code not in ALLOWED_5XX:
                failures.append(
                    f"{case.method} {case.formatted_path} -> {response.status_code} "
                    f"{response.text[:200]}"
                )

        given(strategy)(check)()
    assert not failures, "\n".join(failures[:20])

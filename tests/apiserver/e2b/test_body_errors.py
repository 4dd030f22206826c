"""A create body whose field has the wrong type is a 400 naming the field and the type it
expects (never "required", which is for a field left out, null or empty)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from sandboxctl.apiserver.e2b import E2bConfig, create_e2b_app
from sandboxctl.clock import ManualClock
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.inventory.memory import MemoryInventorySource
from sandboxctl.store import SandboxStore
from tests.apiserver.e2b.test_http import KEY, T0, entry, node
from tests.apiserver.helpers import serving


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    source = MemoryInventorySource((node("n1", entry(1)),), clock=ManualClock(T0))
    store = SandboxStore(source, FreshnessRule(), clock=ManualClock(T0))
    config = E2bConfig(domain="example.test", envd_secret=b"s", api_keys={KEY: "default"})
    with serving(create_e2b_app(store, config)) as served:
        yield served


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"templateID": 5}, "templateID: expected a string, got int"),
        ({"templateID": True}, "templateID: expected a string, got bool"),
        ({"templateID": ["base"]}, "templateID: expected a string, got list"),
        ({"templateID": "base", "timeout": "60"}, "timeout: expected an integer, got str"),
        ({"templateID": "base", "metadata": {"a": 1}}, "metadata.a: expected a string, got int"),
        ({"templateID": "base", "autoPause": 1}, "autoPause: expected true or false, got int"),
        ({"templateID": "base", "network": 5}, "network: expected an object, got int"),
        ({}, "templateID: required"),
        ({"templateID": None}, "templateID: required"),
    ],
)
def test_a_field_of_the_wrong_type_names_the_type(url: str, body: object, message: str) -> None:
    for path in ("/sandboxes", "/v2/sandboxes"):
        answer = httpx.post(url + path, json=body, headers={"X-API-Key": KEY}, timeout=10)
        assert (answer.status_code, answer.json()) == (400, {"code": 400, "message": message})

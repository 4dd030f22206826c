"""The e2b API over plain HTTP on a static in-memory fleet (no node access): the error
table, the list cursor, auth and tenancy. Claims answer 503 here (no routing)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from sandboxctl.apiserver.e2b import E2bConfig, create_e2b_app
from sandboxctl.clock import ManualClock
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.model import Entry, Metadata, NodeInventory, Pool, PoolKey
from sandboxctl.inventory.memory import MemoryInventorySource
from sandboxctl.store import SandboxStore
from tests.apiserver.helpers import serving

T0 = datetime(2026, 11, 30, 4, 0, tzinfo=UTC)
KEY = "e2b_" + "1" * 40
OTHER = "e2b_" + "2" * 40
REQUIRED = {
    "templateID", "sandboxID", "clientID", "startedAt", "endAt", "cpuCount", "memoryMB",
    "diskSizeMB", "state", "envdVersion",
}  # fmt: skip


def entry(n: int, namespace: str = "default", **fields: Any) -> Entry:
    values: dict[str, Any] = dict(
        name=f"{namespace}/s{n:02d}",
        phase="Running",
        id=f"sb_{n:04x}{namespace[:2]}",
        template="base",
        claim_ref=f"{namespace}/s{n:02d}",
        deadline=T0 + timedelta(minutes=5),
        claimed_at=T0 - timedelta(seconds=100 - n // 2),  # pairs share a second: ties
        metadata=Metadata({"n": str(n), "team": "a b&c" if n % 2 else "plain"}),
        cpu_count=1,
        memory_bytes=512 << 20,
    )
    values.update(fields)
    return Entry(**values)


def node(name: str, *entries: Entry) -> NodeInventory:
    return NodeInventory(
        node=name,
        address=f"{name}.invalid:7777",
        pools=(Pool(PoolKey("base"), warm=1, target=1), Pool(PoolKey("python"), 1, 1)),
        entries=entries,
        published_at=T0,
    )


@pytest.fixture
def source() -> MemoryInventorySource:
    clock = ManualClock(T0)
    return MemoryInventorySource(
        (
            node("n1", *(entry(n) for n in range(0, 10, 2)), entry(50, "team")),
            node("n2", *(entry(n) for n in range(1, 10, 2)), entry(7, phase="Hibernated",
                 id="sb_paused", name="default/p", claim_ref="default/p")),
        ),
        clock=clock,
    )  # fmt: skip


@pytest.fixture
def client(source: MemoryInventorySource) -> Iterator[httpx.Client]:
    store = SandboxStore(source, FreshnessRule(), clock=ManualClock(T0))
    config = E2bConfig(
        domain="example.test", envd_secret=b"s", api_keys={KEY: "default", OTHER: "team"}
    )
    with (
        serving(create_e2b_app(store, config)) as url,
        httpx.Client(base_url=url, headers={"X-API-Key": KEY}, timeout=10) as http,
    ):
        yield http


def ids(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [item["sandboxID"] for item in response.json()]


def test_health_needs_no_key(client: httpx.Client) -> None:
    assert client.get("/health", headers={"X-API-Key": ""}).status_code == 204


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/v2/sandboxes", b"{not json", 400),
        ("POST", "/v2/sandboxes", b"[1]", 400),
        ("POST", "/v2/sandboxes", b"", 400),
        ("POST", "/v2/sandboxes", {}, 400),
        ("POST", "/v2/sandboxes", {"templateID": 3}, 400),
        ("POST", "/v2/sandboxes", {"templateID": "base", "timeout": -1}, 400),
        ("POST", "/v2/sandboxes", {"templateID": "base", "timeout": "60"}, 400),
        ("POST", "/v2/sandboxes", {"templateID": "base", "timeout": True}, 400),
        ("POST", "/v2/sandboxes", {"templateID": "base", "metadata": {"a": 1}}, 400),
        ("POST", "/v2/sandboxes", {"templateID": "base", "envVars": []}, 400),
        ("POST", "/v2/sandboxes", {"templateID": "base", "secure": False}, 400),
        ("POST", "/sandboxes", {"templateID": "base", "network": {"allowOut": ["a.example"]}}, 400),
        ("POST", "/sandboxes", {"templateID": "base", "network": {"egressProxy": {"a": 1}}}, 400),
        ("PUT", "/sandboxes/sb-0a0a0a0a/network", {"allowOut": ["a.example"]}, 400),
        ("PUT", "/sandboxes/sb-0a0a0a0a/network", {"egressProxy": {"address": "x:1"}}, 400),
        ("PUT", "/sandboxes/sb-0a0a0a0a/network", {"allow_internet_access": "yes"}, 400),
        ("PUT", "/sandboxes/sb-0a0a0a0a/network", {}, 404),
        ("POST", "/v2/sandboxes", {"templateID": "base", "volumeMounts": [{"name": "v"}]}, 400),
        ("POST", "/v2/sandboxes", {"templateID": "base", "mcp": {"x": {}}}, 400),
        ("POST", "/v2/sandboxes", {"templateID": "base", "autoResume": {"enabled": True}}, 400),
        ("POST", "/v2/sandboxes", {"templateID": "base", "autoPauseMemory": False}, 400),
        ("POST", "/v2/sandboxes", {"templateID": "base", "wat": 1}, 400),
        (
            "POST",
            "/v2/sandboxes",
            {"templateID": "base", "autoPause": True, "allow_internet_access": True},
            400,
        ),
        ("POST", "/v2/sandboxes", {"templateID": "nope"}, 404),
        ("POST", "/v2/sandboxes", {"templateID": "base"}, 503),  # no claim routing here
        ("GET", "/v2/sandboxes?limit=0", None, 400),
        ("GET", "/v2/sandboxes?limit=101", None, 400),
        ("GET", "/v2/sandboxes?limit=x", None, 400),
        ("GET", "/v2/sandboxes?order=up", None, 400),
        ("GET", "/v2/sandboxes?state=dead", None, 400),
        ("GET", "/v2/sandboxes?nextToken=%%%", None, 400),
        ("GET", "/v2/sandboxes?nextToken=bm90IGEgdG9rZW4", None, 400),
        ("GET", "/v2/sandboxes?metadata=novalue", None, 400),
        ("GET", "/v2/sandboxes?metadata=a%3D1%26a%3D2", None, 400),
        ("GET", "/v2/sandboxes?startedAfter=yesterday", None, 400),
        ("GET", "/sandboxes/sb-unknown", None, 404),
        ("DELETE", "/sandboxes/sb-unknown", None, 404),
        ("POST", "/sandboxes/sb-unknown/timeout", {"timeout": 10}, 404),
        ("POST", "/sandboxes/sb_0000de/timeout", {"timeout": -5}, 400),
        ("POST", "/sandboxes/sb_0000de/timeout", {}, 400),
        ("POST", "/sandboxes/sb_0000de/refreshes", {"duration": 3601}, 400),
        ("POST", "/v2/sandboxes/sb-unknown/connect", {}, 404),
        ("POST", "/v2/sandboxes/sb_0000de/connect", {"memory": False}, 400),
        ("POST", "/sandboxes/sb_0000de/pause", {"memory": False}, 400),
        ("POST", "/sandboxes/sb_0000de/resume", {"autoPause": True}, 400),
        ("GET", "/sandboxes/sb-unknown/logs", None, 404),
        ("GET", "/templates/aliases/nope", None, 404),
        ("GET", "/no/such/path", None, 404),
        ("PUT", "/v2/sandboxes", None, 405),
    ],
)
def test_error_table(
    client: httpx.Client, method: str, path: str, body: object, status: int
) -> None:
    content = body if isinstance(body, bytes) else None
    payload = None if isinstance(body, bytes) or body is None else body
    response = client.request(method, path, content=content, json=payload)
    assert response.status_code == status, response.text
    error = response.json()
    assert isinstance(error["code"], int)
    assert error["code"] == status
    assert isinstance(error["message"], str)
    assert error["message"]


def test_unsupported_options_are_named(client: httpx.Client) -> None:
    for option, value in (
        ("network", {"x": 1}),
        ("volumeMounts", [1]),
        ("mcp", {"a": 1}),
        ("mcp", ""),  # given, though empty: asked for, and refused
    ):
        reply = client.post("/v2/sandboxes", json={"templateID": "base", option: value})
        assert reply.status_code == 400
        assert option in reply.json()["message"]
    reply = client.post("/v2/sandboxes", json={"templateID": "nope"})
    assert "nope" in reply.json()["message"]


@pytest.mark.parametrize("key", [None, "", "e2b_" + "9" * 40, KEY + "x", KEY[:-1]])
def test_missing_or_wrong_key_is_401(client: httpx.Client, key: str | None) -> None:
    headers = {} if key is None else {"X-API-Key": key}
    with httpx.Client(base_url=str(client.base_url), headers=headers) as anonymous:
        for method, path in (
            ("GET", "/v2/sandboxes"),
            ("GET", "/sandboxes/sb_0000de"),
            ("POST", "/v2/sandboxes"),
            ("DELETE", "/sandboxes/sb_0000de"),
        ):
            reply = anonymous.request(method, path)
            assert reply.status_code == 401
            assert reply.json() == {"code": 401, "message": "invalid API key"}


def test_tenancy(client: httpx.Client) -> None:
    team = {"X-API-Key": OTHER}
    assert ids(client.get("/v2/sandboxes", headers=team)) == ["sb-0032te"]
    assert "sb-0032te" not in ids(client.get("/v2/sandboxes"))
    assert client.get("/sandboxes/sb-0032te").status_code == 404
    assert client.delete("/sandboxes/sb-0032te").status_code == 404
    assert client.get("/sandboxes/sb-0000de", headers=team).status_code == 404


def test_listed_fields_and_both_id_spellings(client: httpx.Client) -> None:
    items = client.get("/v2/sandboxes", params={"limit": 100}).json()
    assert len(items) == 11
    for item in items:
        assert set(item) >= REQUIRED
        assert item["state"] in ("running", "paused")
        assert item["diskSizeMB"] == 0
        assert item["memoryMB"] == 512
        assert "_" not in item["sandboxID"]
    assert client.get("/v2/sandboxes?state=paused").json()[0]["sandboxID"] == "sb-paused"
    logs = client.get("/sandboxes/sb_0000de/logs")
    assert logs.status_code == 200
    assert logs.json()["logs"] == []
    assert client.get("/v2/sandboxes/sb-0000de/logs").status_code == 200


def test_metadata_filter_double_encoding(client: httpx.Client) -> None:
    # what the SDK sends for {"team": "a b&c"}
    found = ids(client.get("/v2/sandboxes?metadata=team%3Da%252520b%252526c"))
    assert sorted(found) == sorted(["sb-0001de", "sb-0003de", "sb-0005de", "sb-0007de",
                                    "sb-0009de", "sb-paused"])  # fmt: skip
    assert ids(client.get("/v2/sandboxes?metadata=team%3Dplain%26n%3D4")) == ["sb-0004de"]
    assert ids(client.get("/v2/sandboxes?metadata=n%3D4&state=paused")) == []


def test_order_and_started_after(client: httpx.Client) -> None:
    newest_first = client.get("/v2/sandboxes").json()
    stamps = [(i["startedAt"], i["sandboxID"]) for i in newest_first]
    assert stamps == sorted(stamps, reverse=True)
    oldest_first = client.get("/v2/sandboxes?order=asc").json()
    assert oldest_first == newest_first[::-1]
    after = (T0 - timedelta(seconds=97)).isoformat()
    recent = client.get("/v2/sandboxes", params={"startedAfter": after}).json()
    assert recent
    assert all(i["startedAt"] > "2026-11-30T03:58:23Z" for i in recent)


def _all_pages(client: httpx.Client, between: Any = None, **params: Any) -> list[str]:
    seen: list[str] = []
    token = None
    while True:
        query = dict(params, **({"nextToken": token} if token else {}))
        reply = client.get("/v2/sandboxes", params=query)
        seen.extend(ids(reply))
        token = reply.headers.get("X-Next-Token")
        if not token:
            return seen
        base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))  # base64url
        if between is not None:
            between(len(seen))


@pytest.mark.parametrize("order", ["desc", "asc"])
def test_cursor_neither_repeats_nor_skips(
    client: httpx.Client, source: MemoryInventorySource, order: str
) -> None:
    everything = _all_pages(client, limit=100, order=order)
    assert len(everything) == 11
    assert _all_pages(client, limit=2, order=order) == everything
    assert _all_pages(client, limit=3, order=order) == everything

    n1 = source.snapshot().record("n1")
    assert n1 is not None
    original = n1.inventory

    def churn(count: int) -> None:
        if count != 4:
            return
        # between pages: one already listed goes away, one not yet listed goes away,
        # and a new one comes (newest, so it sorts before the cursor in desc order)
        kept = [e for e in original.entries if e.id not in ("sb_0008de", "sb_0000de")]
        newcomer = entry(60, claimed_at=T0)
        source.apply(replace(original, entries=(*kept, newcomer)))

    paged = _all_pages(client, churn, limit=2, order=order)
    assert len(paged) == len(set(paged))  # no repeats
    first_four = everything[:4]
    assert paged[:4] == first_four
    survivors = [i for i in everything[4:] if i not in ("sb-0008de", "sb-0000de")]
    assert [i for i in paged[4:] if i != "sb-003cde"] == survivors  # no skips


def test_template_alias_lookup(client: httpx.Client) -> None:
    reply = client.get("/templates/aliases/code-interpreter-v1")
    assert reply.status_code == 200
    assert reply.json()["templateID"] == "base"
    assert ids(client.get("/v2/sandboxes?template=python")) == []
    assert len(ids(client.get("/v2/sandboxes?template=code-interpreter-v1"))) == 11

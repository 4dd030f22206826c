"""The envd proxy over real HTTP on loopback: a static fleet whose node addresses are
stand-in agents (tests/proxy/standin.py)."""

from __future__ import annotations

import json
import resource
from collections.abc import Iterator
from datetime import UTC, datetime
from urllib.parse import quote, urlencode

import httpx
import pytest

from sandboxctl.core.ids import SandboxId
from sandboxctl.core.model import Entry, NodeInventory
from tests.apiserver.helpers import serving
from tests.proxy.conftest import (
    DOMAIN,
    FLEET_TOKEN,
    LISTED,
    SECRET,
    STALE,
    UNLISTED,
    UNLISTED_2,
    Fleet,
    Headers,
    access,
    public,
)
from tests.proxy.standin import StandIn

MiB = 1024 * 1024


def not_found(sandbox_id: str) -> bytes:
    return json.dumps(
        {"code": 502, "message": f"The sandbox {sandbox_id} was not found"},
        separators=(",", ":"),
    ).encode()


def test_header_routing_relays_to_the_owning_node(
    client: httpx.Client, sdk_headers: Headers
) -> None:
    headers = {**sdk_headers(), "X-API-Key": "e2b_secret", "Authorization": "Basic cm9vdDo="}
    response = client.post("/echo/a%20b?path=%2Fhome%2Fx&n=1", headers=headers, content=b"hi")
    assert response.status_code == 200, response.text
    echo = response.json()
    assert echo["path"] == f"/v1/sandboxes/{LISTED}/envd/echo/a b"
    assert echo["raw_path"] == f"/v1/sandboxes/{LISTED}/envd/echo/a%20b"
    assert echo["query"] == "path=%2Fhome%2Fx&n=1"
    assert echo["body"] == "hi"
    seen = echo["headers"]
    assert "x-api-key" not in seen
    assert seen["authorization"] == "Bearer claim-token-a"
    assert seen["x-forwarded-authorization"] == "Basic cm9vdDo="
    assert seen["x-access-token"] == access(LISTED)  # forwarded unchanged to envd
    assert seen["e2b-sandbox-id"] == public(LISTED)


def test_chunked_request_body_is_relayed(client: httpx.Client, sdk_headers: Headers) -> None:
    def parts() -> Iterator[bytes]:
        yield b"\x00\x00\x00\x00\x02"
        yield b"{}"

    response = client.post("/process.Process/Start", headers=sdk_headers(), content=parts())
    assert response.status_code == 200
    assert response.json()["body"] == "\x00\x00\x00\x00\x02{}"


def test_host_routing(client: httpx.Client) -> None:
    host = f"49983-{public(LISTED)}.{DOMAIN}:3001"
    response = client.get("/echo", headers={"Host": host, "X-Access-Token": access(LISTED)})
    assert response.status_code == 200, response.text
    assert response.json()["path"] == f"/v1/sandboxes/{LISTED}/envd/echo"
    assert response.json()["headers"]["x-forwarded-host"] == host


def test_the_headers_win_over_the_host(client: httpx.Client, sdk_headers: Headers) -> None:
    host = f"49983-sb-ffffffff.{DOMAIN}"
    response = client.get("/echo", headers={**sdk_headers(), "Host": host})
    assert response.status_code == 200
    assert response.json()["path"] == f"/v1/sandboxes/{LISTED}/envd/echo"


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({}, "no sandbox in the request host or headers"),
        ({"Host": "elsewhere.test"}, "no sandbox in the request host or headers"),
        ({"Host": f"a.b.{DOMAIN}"}, "no sandbox in the request host or headers"),
        ({"E2b-Sandbox-Id": "sb-x", "E2b-Sandbox-Port": "+49983"}, "bad sandbox port"),
        ({"E2b-Sandbox-Id": "sb-x", "E2b-Sandbox-Port": "0"}, "bad sandbox port"),
        ({"E2b-Sandbox-Id": "sb-x", "E2b-Sandbox-Port": "65536"}, "bad sandbox port"),
        ({"E2b-Sandbox-Id": "sb-x"}, "bad sandbox port"),
        ({"Host": f"x1-sb-x.{DOMAIN}"}, "bad sandbox port"),
    ],
)
def test_bad_requests(client: httpx.Client, headers: dict[str, str], message: str) -> None:
    response = client.get("/echo", headers=headers)
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == 400
    assert body["message"].startswith(message)


@pytest.mark.parametrize(
    "path", ["/init", "/FREEZE", "/unfreeze/", "/fsfreeze", "/fsthaw", "/collapse"]
)
def test_envd_internal_paths_are_404(
    client: httpx.Client, sdk_headers: Headers, fleet: Fleet, path: str
) -> None:
    before = fleet.standins["node-a"].count()
    response = client.post(path, headers=sdk_headers(), content=b"{}")
    assert response.status_code == 404
    assert response.json()["code"] == 404
    assert fleet.standins["node-a"].count() == before


def test_missing_or_wrong_token_is_401(client: httpx.Client, sdk_headers: Headers) -> None:
    missing = {k: v for k, v in sdk_headers().items() if k != "X-Access-Token"}
    response = client.get("/echo", headers=missing)
    assert response.status_code == 401
    assert response.json()["code"] == 401
    # a token derived from another sandbox's claim
    response = client.get("/echo", headers=sdk_headers(token=access(UNLISTED)))
    assert response.status_code == 401
    assert response.json()["code"] == 401
    response = client.get("/echo", headers=sdk_headers(token=access(LISTED).upper()))
    assert response.status_code == 401


def signed(
    operation: str,
    path: str = "/home/user/a b+c.txt",
    expires_in: int | None = None,
    token: str | None = None,
    user: str | None = None,
) -> str:
    """A ``/files`` URL signed as the SDK's ``download_url``/``upload_url`` sign it."""
    from e2b.sandbox.signature import get_signature

    signature = get_signature(path, operation, user, token or access(LISTED), expires_in)  # type: ignore[arg-type]
    query = {"path": path, **({"username": user} if user else {})}
    query["signature"] = signature["signature"]
    if signature["expiration"]:
        query["signature_expiration"] = str(signature["expiration"])
    return "/files?" + urlencode(query, quote_via=quote)


def test_a_signed_file_url_needs_no_token(client: httpx.Client) -> None:
    host = {"Host": f"49983-{public(LISTED)}.{DOMAIN}"}
    for method, operation, expires in (("GET", "read", None), ("POST", "write", 60)):
        url = signed(operation, expires_in=expires, user="user")
        response = client.request(method, url, headers=host, content=b"data")
        assert response.status_code == 200, response.text
        echo = response.json()
        assert echo["path"] == f"/v1/sandboxes/{LISTED}/envd/files"
        assert echo["query"] == url.partition("?")[2]  # relayed as it came
        assert echo["headers"]["authorization"] == "Bearer claim-token-a"


@pytest.mark.parametrize(
    ("method", "url", "status", "message"),
    [
        ("GET", signed("read", expires_in=-1), 401, "signature has expired"),
        ("POST", signed("read"), 401, "does not match"),  # signed to read, used to write
        ("GET", signed("read", token="0" * 64), 401, "does not match"),  # another sandbox's
        ("GET", signed("read").replace("a%20b", "a%20c"), 401, "does not match"),
        ("GET", signed("read") + "&signature_expiration=soon", 400, "unix seconds"),
        ("GET", signed("read") + "&signature=v1_x", 400, "once"),
        ("GET", "/echo?" + signed("read").partition("?")[2], 401, "missing X-Access-Token"),
    ],
)
def test_a_bad_signed_file_url_is_refused(
    client: httpx.Client, method: str, url: str, status: int, message: str
) -> None:
    response = client.request(method, url, headers={"Host": f"49983-{public(LISTED)}.{DOMAIN}"})
    assert response.status_code == status, response.text
    assert message in response.json()["message"]


def test_health_needs_no_token(client: httpx.Client, sdk_headers: Headers) -> None:
    headers = {k: v for k, v in sdk_headers().items() if k != "X-Access-Token"}
    assert client.get("/health", headers=headers).status_code == 204


def test_unknown_id_is_502_with_the_sdks_not_found_body(
    client: httpx.Client, sdk_headers: Headers
) -> None:
    headers = {**sdk_headers(), "E2b-Sandbox-Id": "sb-deadbeef"}
    response = client.get("/echo", headers=headers)
    assert response.status_code == 502
    assert response.content == not_found("sb-deadbeef")
    assert response.headers["should-retry"] == "false"


def test_other_ports_go_to_the_agents_guest_port_route(
    client: httpx.Client, sdk_headers: Headers, fleet: Fleet
) -> None:
    standin = fleet.standins["node-a"]
    response = client.get("/init?a=1", headers=sdk_headers(port="49999"))
    # Relayed, not answered by the proxy: envd's internal paths mean nothing on a guest port.
    assert standin.requests[-1] == f"GET /v1/sandboxes/{LISTED}/ports/49999/init"
    assert response.status_code == 404  # the stand-in serves no guest port


def test_a_sandbox_on_a_stale_node_is_unknown_and_the_node_hears_nothing(
    fleet: Fleet, sdk_headers: Headers
) -> None:
    stale = fleet.standins["node-stale"]
    assert stale.count() == 0
    with serving(fleet.proxy()) as url, httpx.Client(base_url=url, timeout=15) as client:
        for _ in range(3):  # the inventory misses, then a probe of the fresh nodes
            response = client.get("/echo", headers=sdk_headers(STALE))
            assert response.status_code == 502
            assert response.content == not_found(public(STALE))
        metrics = client.get("/metrics").text
    assert stale.count() == 0
    assert "sandboxctl_envd_proxy_probes_total 3.0" in metrics


def test_an_unlisted_sandbox_is_found_by_a_probe_within_the_budget(
    fleet: Fleet, sdk_headers: Headers
) -> None:
    proxy = fleet.proxy(probe_rate=0.001, probe_burst=1)
    with serving(proxy) as url, httpx.Client(base_url=url, timeout=15) as client:
        response = client.get("/echo", headers=sdk_headers(UNLISTED))
        assert response.status_code == 200, response.text
        assert response.json()["path"] == f"/v1/sandboxes/{UNLISTED}/envd/echo"
        # cached: no probe needed for it again
        assert client.get("/echo", headers=sdk_headers(UNLISTED)).status_code == 200
        # the budget is spent: another unlisted id is unknown though node-b has it
        response = client.get("/echo", headers=sdk_headers(UNLISTED_2))
        assert response.status_code == 502
        assert response.content == not_found(public(UNLISTED_2))
        metrics = client.get("/metrics").text
    assert "sandboxctl_envd_proxy_probes_total 1.0" in metrics
    assert 'sandboxctl_envd_proxy_requests_total{outcome="routed"} 2.0' in metrics
    assert 'sandboxctl_envd_proxy_requests_total{outcome="unknown"} 1.0' in metrics


def test_an_owner_the_e2b_api_found_is_routed_to_without_a_probe(
    fleet: Fleet, sdk_headers: Headers
) -> None:
    # One memory of owners per process: what an e2b lookup learnt by asking the nodes, the
    # proxy of the same store routes by, spending no probe.
    sandbox_id = SandboxId.parse(public(UNLISTED_2))
    fleet.store.forget(sandbox_id)
    try:
        assert fleet.store.locate_claim(sandbox_id, "default") is not None  # asks the nodes
        assert fleet.store.cached_owner(sandbox_id) is None  # no claim token yet
        with (
            serving(fleet.proxy(probe_rate=0.001, probe_burst=1)) as url,
            httpx.Client(base_url=url, timeout=15) as client,
        ):
            response = client.get("/echo", headers=sdk_headers(UNLISTED_2))
            assert response.status_code == 200, response.text
            metrics = client.get("/metrics").text
        assert "sandboxctl_envd_proxy_probes_total 0.0" in metrics
        assert fleet.store.cached_owner(sandbox_id) is not None  # now with its token
    finally:
        fleet.store.forget(sandbox_id)


def test_an_unreachable_node_is_502_with_the_same_body(sdk_headers: Headers) -> None:
    from sandboxctl.core.freshness import FreshnessRule
    from sandboxctl.inventory.memory import MemoryInventorySource
    from sandboxctl.proxy import create_proxy_app
    from sandboxctl.store import SandboxStore
    from sandboxctl.store.nodes import NodeAccess

    standin = StandIn(FLEET_TOKEN, {LISTED: "claim-token-a"})
    with serving(standin) as node_url:
        inventory = NodeInventory(
            "node-x",
            node_url.removeprefix("http://"),
            entries=(Entry(name=f"default/{LISTED}", phase="Running", id=LISTED),),
            published_at=datetime.now(UTC),
        )
        store = SandboxStore(
            MemoryInventorySource([inventory]), FreshnessRule(), nodes=NodeAccess(FLEET_TOKEN)
        )
        proxy = serving(create_proxy_app(store, SECRET, DOMAIN))
        url = proxy.__enter__()
        client = httpx.Client(base_url=url, timeout=15)
        assert client.get("/echo", headers=sdk_headers()).status_code == 200
    try:
        # the node is gone but its owner is cached: the relay cannot connect
        response = client.get("/echo", headers=sdk_headers())
        assert response.status_code == 502
        assert response.content == not_found(public(LISTED))
        # then the inventory path: the by-id read cannot connect either
        response = client.get("/echo", headers=sdk_headers())
        assert response.status_code == 502
        assert response.content == not_found(public(LISTED))
    finally:
        client.close()
        proxy.__exit__(None, None, None)
        store.close()


def test_a_claim_released_since_it_was_cached_is_not_found(sdk_headers: Headers) -> None:
    from sandboxctl.core.freshness import FreshnessRule
    from sandboxctl.inventory.memory import MemoryInventorySource
    from sandboxctl.proxy import create_proxy_app
    from sandboxctl.store import SandboxStore
    from sandboxctl.store.nodes import NodeAccess

    standin = StandIn(FLEET_TOKEN, {LISTED: "claim-token-a"})
    with serving(standin) as node_url:
        inventory = NodeInventory(
            "node-x",
            node_url.removeprefix("http://"),
            entries=(Entry(name=f"default/{LISTED}", phase="Running", id=LISTED),),
            published_at=datetime.now(UTC),
        )
        store = SandboxStore(
            MemoryInventorySource([inventory]), FreshnessRule(), nodes=NodeAccess(FLEET_TOKEN)
        )
        try:
            app = create_proxy_app(store, SECRET, DOMAIN)
            with serving(app) as url, httpx.Client(base_url=url, timeout=15) as client:
                assert client.get("/echo", headers=sdk_headers()).status_code == 200
                standin.tokens[LISTED] = "a-new-claim-token"  # released, id reused
                # The cached owner's token is refused by the node: not found, uncached.
                response = client.get("/echo", headers=sdk_headers())
                assert response.status_code == 502
                assert response.content == not_found(public(LISTED))
                # Resolved afresh: the caller's token is not derived from the new claim.
                assert client.get("/echo", headers=sdk_headers()).status_code == 401
        finally:
            store.close()


def test_a_streamed_response_arrives_incrementally(
    client: httpx.Client, sdk_headers: Headers, fleet: Fleet
) -> None:
    standin = fleet.standins["node-a"]
    standin.release.clear()
    try:
        with client.stream("POST", "/stream", headers=sdk_headers(), content=b"x") as response:
            assert response.status_code == 200
            assert response.headers["content-type"] == "application/connect+json"
            chunks = response.iter_raw()
            # The stand-in holds the rest until released: this chunk came through alone.
            assert next(chunks) == b"first\n"
            standin.release.set()
            assert b"".join(chunks) == b"second\n"
    finally:
        standin.release.set()


def test_a_caller_hanging_up_closes_the_relay(
    client: httpx.Client, sdk_headers: Headers, fleet: Fleet
) -> None:
    standin = fleet.standins["node-a"]
    standin.hung_up.clear()
    with client.stream("GET", "/hold", headers=sdk_headers()) as response:
        assert next(response.iter_raw()) == b"first\n"
    # The caller closed its connection mid-stream: the proxy closes the node's too.
    assert standin.hung_up.wait(timeout=10)


def test_a_large_upload_streams_through(
    client: httpx.Client, sdk_headers: Headers, fleet: Fleet
) -> None:
    standin = fleet.standins["node-a"]
    standin.upload.chunks = standin.upload.received = 0
    total = 200 * MiB
    block = b"\x5a" * MiB
    seen_midway: list[int] = []

    def body() -> Iterator[bytes]:
        for index in range(total // MiB):
            if index == 150:
                # 150 MiB have left the client: with a streaming relay nearly all of it
                # reached the node already (only socket buffers hold the rest).
                seen_midway.append(standin.upload.received)
            yield block

    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    response = client.post("/upload", headers=sdk_headers(), content=body())
    peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert response.status_code == 200, response.text
    assert response.json()["received"] == total
    assert standin.upload.chunks >= 100  # relayed in pieces, not as one body
    assert seen_midway[0] >= 100 * MiB, seen_midway
    # Proxy, stand-in and client share this process: buffering the body anywhere would
    # raise the peak by 200 MiB.
    assert (peak_after - peak_before) * 1024 < 64 * MiB


def test_healthz_and_metrics(client: httpx.Client, sdk_headers: Headers) -> None:
    assert client.get("/healthz").status_code == 204
    client.get("/echo", headers=sdk_headers())
    client.get("/echo")
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert 'sandboxctl_envd_proxy_requests_total{outcome="routed"} 1.0' in metrics.text
    assert 'sandboxctl_envd_proxy_requests_total{outcome="bad_request"} 1.0' in metrics.text
    # with a sandbox named, /metrics is envd's, relayed
    assert client.get("/metrics", headers=sdk_headers()).json()["path"].endswith("/envd/metrics")


def test_requests_to_one_agent_share_a_kept_alive_connection(
    client: httpx.Client, sdk_headers: Headers
) -> None:
    for _ in range(5):
        assert client.post("/echo", headers=sdk_headers(), content=b"x").status_code == 200
    metrics = client.get("/metrics").text
    assert "sandboxctl_envd_proxy_agent_connections_total 1.0" in metrics


def test_a_sandbox_its_listed_node_no_longer_has_is_found_by_a_probe(
    sdk_headers: Headers,
) -> None:
    # The inventory still names node-a (it moved, or node-a's publish lags): node-a says
    # 404, and the probe finds it where it is now, as the proxy always did.
    from sandboxctl.core.freshness import FreshnessRule
    from sandboxctl.inventory.memory import MemoryInventorySource
    from sandboxctl.store import SandboxStore
    from sandboxctl.store.nodes import NodeAccess

    old, now = StandIn(FLEET_TOKEN, {}), StandIn(FLEET_TOKEN, {LISTED: "claim-token-a"})
    with serving(old) as old_url, serving(now) as now_url:
        stamp = datetime.now(UTC)
        entry = Entry(name=f"default/{LISTED}", phase="Running", id=LISTED)
        source = MemoryInventorySource(
            [
                NodeInventory(
                    "node-a", old_url.removeprefix("http://"), entries=(entry,), published_at=stamp
                ),
                NodeInventory("node-b", now_url.removeprefix("http://"), published_at=stamp),
            ]
        )
        store = SandboxStore(source, FreshnessRule(), nodes=NodeAccess(FLEET_TOKEN))
        try:
            owner = store.owner(SandboxId.of_claim(LISTED))
            assert owner is not None
            assert (owner.node, owner.token) == ("node-b", "claim-token-a")
        finally:
            store.close()

"""The agent's HTTP API over real HTTP on loopback, with a root token."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandboxctl.agentapi import AgentClient, AgentError, ClaimRequest, PoolTarget
from sandboxctl.core import wire
from sandboxctl.core.model import PoolKey
from sandboxctl.envd.host import Command
from sandboxctl.sandboxd import entering
from sandboxctl.sandboxd.agent import Agent
from tests.sandboxd.servers import serving

ROOT = "root-token-for-tests"


@pytest.fixture
def address(agent: Agent) -> Iterator[str]:
    agent.refill_once()
    with serving(agent, ROOT) as address:
        yield address


@pytest.fixture
def client(address: str) -> Iterator[AgentClient]:
    with AgentClient(address, ROOT) as client:
        yield client


def _requests(client: AgentClient, route: str, method: str, status: int) -> float:
    pattern = (
        rf'sandboxd_requests_total\{{method="{method}",route="{re.escape(route)}",'
        rf'status="{status}"\}} ([0-9.e+]+)'
    )
    match = re.search(pattern, client.metrics())
    return float(match.group(1)) if match else 0.0


def test_info_lists_pools_counts_and_capacity(client: AgentClient) -> None:
    info = wire.plain(client.info())
    assert info["node"] == "n1"
    assert info["advertise_addr"] == "127.0.0.1:7777"
    assert info["pools"] == [
        {"key": {"template": "base", "net": "none", "size": "small"}, "warm": 2, "target": 2,
         "refilling": 0}
    ]  # fmt: skip
    assert (info["claimed"], info["hibernated"], info["capacity"], info["at_capacity"]) == (
        0, 0, 6, False,
    )  # fmt: skip


def test_claim_list_get_release(client: AgentClient) -> None:
    claimed = client.claim(
        ClaimRequest("base", claim_ref="team/a", metadata={"owner": "x"}, ttl_seconds=120)
    )
    assert set(wire.plain(claimed)) == {"id", "token", "deadline", "owner_addr", "sandbox"}
    assert claimed.owner_addr == "127.0.0.1:7777"
    client.claim(ClaimRequest("base", claim_ref="team/b"))

    rows = client.sandboxes(claim_ref="team/a")
    assert [r.id for r in rows] == [claimed.id]
    assert claimed.sandbox == rows[0]  # the grant carries the row the list shows
    row = wire.plain(rows[0])
    assert row["key"] == {"template": "base", "net": "none", "size": "small"}
    assert row["metadata"] == {"owner": "x"}
    assert rows[0].deadline == claimed.deadline
    assert row["hibernated"] is False
    assert row["cpu_count"] == 1
    assert row["mem_total_bytes"] == 512 << 20
    assert "token" not in row
    assert client.get(claimed.id).token == claimed.token
    assert len(client.sandboxes()) == 2
    assert client.sandboxes(claim_ref="team") == []

    client.release(claimed.id)
    with pytest.raises(AgentError) as gone:
        client.release(claimed.id)
    assert gone.value.status == 404


def test_a_claims_env_is_stored_and_never_listed(
    agent: Agent, address: str, client: AgentClient
) -> None:
    secret = "s3cr3t-" + "x" * 20
    claimed = client.claim(
        ClaimRequest("base", claim_ref="team/a", env={"API_KEY": secret, "FOO": "bar"})
    )

    assert agent.get(claimed.id).env == {"API_KEY": secret, "FOO": "bar"}
    for path in ("/v1/sandboxes", f"/v1/sandboxes/{claimed.id}", "/v1/info", "/metrics"):
        response = httpx.get(f"http://{address}{path}", headers={"Authorization": f"Bearer {ROOT}"})
        assert response.status_code == 200
        assert secret not in response.text
        assert "API_KEY" not in response.text
    assert "env" not in wire.plain(client.get(claimed.id))
    assert ["env" in wire.plain(row) for row in client.sandboxes()] == [False]


def test_renew_hibernate_and_wake_with_the_sandbox_token(address: str, client: AgentClient) -> None:
    claimed = client.claim(ClaimRequest("base"))
    own = AgentClient(address, claimed.token)

    renewed = own.renew(claimed.id, 900)
    assert renewed.deadline is not None
    assert claimed.deadline is not None
    assert renewed.deadline > claimed.deadline
    own.hibernate(claimed.id)
    assert client.get(claimed.id).hibernated is True
    with pytest.raises(AgentError) as twice:
        own.hibernate(claimed.id)
    assert twice.value.status == 409
    own.wake(claimed.id)
    own.release(claimed.id)
    own.close()


@pytest.mark.parametrize("token", [None, "wrong"])
def test_without_the_root_token_every_call_is_401(address: str, token: str | None) -> None:
    with AgentClient(address, token) as stranger:
        for call in (
            stranger.info,
            stranger.sandboxes,
            lambda: stranger.claim(ClaimRequest("base")),
        ):
            with pytest.raises(AgentError) as refused:
                call()
            assert refused.value.status == 401


def test_a_sandbox_token_drives_only_its_own_sandbox(address: str, client: AgentClient) -> None:
    mine = client.claim(ClaimRequest("base"))
    theirs = client.claim(ClaimRequest("base"))
    with AgentClient(address, mine.token) as own:
        with pytest.raises(AgentError) as refused:
            own.release(theirs.id)
        assert refused.value.status == 401
        with pytest.raises(AgentError) as no_claims:
            own.claim(ClaimRequest("base"))
        assert no_claims.value.status == 401
    assert len(client.sandboxes()) == 2


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[]", 400, ""),
        (json.dumps({"template": "nope"}).encode(), 404, "template 'nope'"),
        (json.dumps({"template": "base", "ttl_seconds": -5}).encode(), 400, "ttl_seconds"),
        (json.dumps({"template": "base", "ttl_seconds": "5"}).encode(), 400, "ttl_seconds"),
        (json.dumps({"template": "base", "colour": "red"}).encode(), 400, "colour: unknown field"),
        (
            json.dumps({"template": "base", "metadata": {str(i): "v" for i in range(17)}}).encode(),
            400,
            "16 pairs",
        ),
        (b'{"template": "base", "x": "' + b"a" * (2 << 20) + b'"}', 413, "over 1048576 bytes"),
        (
            json.dumps({"template": "base", "env": {"1X": "v"}}).encode(),
            400,
            "env: '1X' is not a variable name",
        ),
        (
            json.dumps({"template": "base", "env": {"A": "x\0y"}}).encode(),
            400,
            "env.A: the value contains a NUL byte",
        ),
        (
            json.dumps({"template": "base", "env": {"A": 1}}).encode(),
            400,
            "env.A: expected a string",
        ),
        (json.dumps({"template": "base", "env": ["A=1"]}).encode(), 400, "env: expected an object"),
        (
            json.dumps({"template": "base", "env": {f"V{i}": "" for i in range(257)}}).encode(),
            400,
            "env: at most 256 variables",
        ),
        (
            json.dumps({"template": "base", "env": {"A": "v" * (64 << 10)}}).encode(),
            400,
            "env: at most 65536 bytes",
        ),
    ],
)
def test_bad_claims_get_a_json_error_and_change_nothing(
    address: str, client: AgentClient, body: bytes, status: int, message: str
) -> None:
    before = client.info()
    response = httpx.post(
        f"http://{address}/v1/claim",
        content=body,
        headers={"Authorization": f"Bearer {ROOT}", "Content-Type": "application/json"},
    )
    assert response.status_code == status
    assert message in response.json()["error"]
    assert client.sandboxes() == []
    assert client.info().pools == before.pools


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "message"),
    [
        ("POST", "/v1/claim", {"Content-Type": "application/x-www-form-urlencoded"},
         b'{"template": "base"}', "the body must be JSON (Content-Type: application/json)"),
        ("POST", "/v1/sandboxes/sb_0/renew", {}, b"", "a JSON object body is required"),
        ("POST", "/v1/sandboxes/sb_0/renew", {}, b'{"on_expire": ""}',
         "on_expire: must be one of destroy, pause"),
        ("PUT", "/v1/pools", {}, b'{"pools": [{"template": "base", "warm": 1, "net": 5}]}',
         "pools[0].net: expected a string, got int"),
    ],
)  # fmt: skip
def test_a_body_is_read_as_json_into_its_model(
    address: str, method: str, path: str, headers: dict[str, str], body: bytes, message: str
) -> None:
    response = httpx.request(
        method,
        f"http://{address}{path}",
        content=body,
        headers={"Authorization": f"Bearer {ROOT}", **headers},
    )
    assert (response.status_code, response.json()) == (400, {"error": message})


def test_a_streamed_body_over_the_cap_is_413(address: str) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"template": "base", "x": "'
        for _ in range(40):
            yield b"a" * 65536
        yield b'"}'

    response = httpx.post(
        f"http://{address}/v1/claim",
        content=chunks(),
        headers={"Authorization": f"Bearer {ROOT}"},
    )
    assert response.status_code == 413
    assert "error" in response.json()


def test_put_pools_replaces_the_set(client: AgentClient) -> None:
    info = client.set_pools([PoolTarget.of(PoolKey("base", size="medium"), 1)])
    assert [(p.key.size, p.target) for p in info.pools if p.target] == [("medium", 1)]
    with pytest.raises(AgentError) as bad:
        client.set_pools([PoolTarget.of(PoolKey("base"), -1)])
    assert bad.value.status == 400
    assert bad.value.message == "pools[0].warm: must not be negative, got -1"


def test_metrics_count_requests_per_route(client: AgentClient) -> None:
    claimed = client.claim(ClaimRequest("base"))
    client.get(claimed.id)
    client.get(claimed.id)

    assert _requests(client, "/v1/claim", "POST", 200) == 1
    assert _requests(client, "/v1/sandboxes/{sandbox_id}", "GET", 200) == 2
    assert _requests(client, "/v1/info", "GET", 200) == 0
    assert "sandboxd_pool_warm" in client.metrics()


def test_unknown_routes_are_json_404(address: str) -> None:
    response = httpx.get(
        f"http://{address}/v2/nothing", headers={"Authorization": f"Bearer {ROOT}"}
    )
    assert response.status_code == 404
    assert response.json() == {"error": "not found"}


def test_no_sandbox_can_reach_the_agents_own_port(
    agent: Agent, address: str, client: AgentClient
) -> None:
    host, port = address.split(":")
    connect = f"import socket; socket.create_connection(({host!r}, {port}), 3).close()"
    results = {}
    for net in ("none", "egress"):
        record = agent.get(client.claim(ClaimRequest("base", net=net)).id)
        entry = agent.runtime.enter(
            agent.spec(record), agent.identity(record), Command(["python3", "-c", connect])
        )
        results[net] = entering.run(entry, timeout=30, text=True)
    # net=egress is a policy for the sandbox's own veth (tests/sandboxd/network): the agent's
    # loopback is never the sandbox's, whatever the net.
    for net in ("none", "egress"):
        assert results[net].returncode != 0
        assert "ConnectionRefused" in results[net].stderr


def test_a_runtime_failure_answers_503_without_host_paths(
    make_agent, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    """What failed, not where: the runtime's own words (host paths, pids) are the log's."""
    from sandboxctl.sandboxd.api import RUNTIME_FAILED

    broken = tmp_path / "broken-root"  # no /proc, /dev... to mount over: the start fails
    broken.mkdir()
    agent = make_agent(pools={}, templates={"broken": broken})
    with (
        serving(agent, ROOT) as address,
        AgentClient(address, ROOT) as client,
        pytest.raises(AgentError) as failed,
    ):
        client.claim(ClaimRequest("broken"))
    assert (failed.value.status, failed.value.message) == (503, RUNTIME_FAILED)
    assert str(broken) in caplog.text  # the operator still learns why

"""The models against a real agent's JSON (bubblewrap sandboxes: root and bubblewrap, as
tests/sandboxd), and the request bodies' strict reading without one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from msgspec import UNSET

from sandboxctl.agentapi import (
    AgentInfo,
    ClaimGrant,
    ClaimRequest,
    PoolsUpdate,
    PoolTarget,
    RenewAnswer,
    RenewRequest,
    SandboxList,
    SandboxRow,
)
from sandboxctl.core import wire
from sandboxctl.core.model import PoolKey
from sandboxctl.core.wire import WireError
from tests.sandboxd.servers import sandboxes_unavailable, serving

ROOT = "models-root-token"

needs_sandboxes = pytest.mark.skipif(
    sandboxes_unavailable() is not None, reason=str(sandboxes_unavailable())
)


@pytest.fixture
def agent_http(state_dir: Path, uid_base: int) -> Iterator[httpx.Client]:
    """A real agent with one warm sandbox, and a plain httpx client: the raw bytes."""
    from sandboxctl.sandboxd.agent import Agent, AgentSettings
    from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime

    settings = AgentSettings(
        node="n1",
        advertise_addr="127.0.0.1:7777",
        state_dir=state_dir,
        pools={PoolKey("base"): 1},
        max_sandboxes=4,
        uid_base=uid_base,
    )
    agent = Agent(settings, BubblewrapRuntime())
    try:
        agent.refill_once()
        with (
            serving(agent, ROOT) as address,
            httpx.Client(
                base_url=f"http://{address}", headers={"Authorization": f"Bearer {ROOT}"}
            ) as http,
        ):
            yield http
    finally:
        agent.stop(destroy=True)


def _round_trips(model: Any, response: httpx.Response) -> Any:
    """The model reads the answer and writes it back byte for byte."""
    assert response.status_code == 200, response.text
    parsed = model.from_json(response.content)
    assert wire.encode(parsed) == response.content
    assert model.from_json(response.json()) == parsed  # plain values read the same
    return parsed


@needs_sandboxes
def test_every_answer_of_a_real_agent_round_trips(agent_http: httpx.Client) -> None:
    info = _round_trips(AgentInfo, agent_http.get("/v1/info"))
    assert (info.node, info.advertise_addr, info.capacity) == ("n1", "127.0.0.1:7777", 4)
    assert [(p.key, p.warm, p.target) for p in info.pools] == [(PoolKey("base"), 1, 1)]

    claim = ClaimRequest(
        "base", claim_ref="team/a", metadata={"b": "2", "a": "1"}, ttl_seconds=60, env={"X": "y"}
    )
    grant = _round_trips(ClaimGrant, agent_http.post("/v1/claim", content=wire.encode(claim)))
    assert grant.owner_addr == "127.0.0.1:7777"

    listed = _round_trips(SandboxList, agent_http.get("/v1/sandboxes"))
    (row,) = listed.sandboxes
    assert (row.id, row.claim_ref, row.token) == (grant.id, "team/a", UNSET)
    assert list(row.metadata) == ["b", "a"], "metadata keeps the claim's order"
    assert row.deadline == grant.deadline

    one = _round_trips(SandboxRow, agent_http.get(f"/v1/sandboxes/{grant.id}"))
    assert one.token == grant.token
    assert b'"env"' not in wire.encode(one)

    renewed = wire.encode(RenewRequest(ttl_seconds=120))
    renewal = agent_http.post(f"/v1/sandboxes/{grant.id}/renew", content=renewed)
    _round_trips(RenewAnswer, renewal)
    agent_http.post(f"/v1/sandboxes/{grant.id}/hibernate").raise_for_status()
    assert _round_trips(SandboxRow, agent_http.get(f"/v1/sandboxes/{grant.id}")).hibernated

    update = wire.encode(PoolsUpdate((PoolTarget.of(PoolKey("base", size="medium"), 1),)))
    after = _round_trips(AgentInfo, agent_http.put("/v1/pools", content=update))
    assert [(p.key.size, p.target) for p in after.pools] == [("medium", 1)]


def test_a_claim_request_round_trips_and_defaults() -> None:
    full = ClaimRequest("py", "egress", "large", 60, "ns/a", {"k": "v"}, "pause", {"A": "1"})
    assert ClaimRequest.from_json(wire.encode(full)) == full
    assert ClaimRequest.from_json({"template": "base"}) == ClaimRequest("base")
    assert ClaimRequest.from_json({"template": "base", "no_redirect": True}) == ClaimRequest("base")
    assert ClaimRequest("base", net="egress").key == PoolKey("base", "egress")


@pytest.mark.parametrize(
    ("body", "field", "problem"),
    [
        ({}, "template", "required"),
        ({"template": ""}, "template", "required"),
        ({"template": "base", "colour": "red"}, "colour", "unknown field"),
        ({"template": "base", "ttl_seconds": "60"}, "ttl_seconds", "expected an integer, got str"),
        ({"template": "base", "ttl_seconds": True}, "ttl_seconds", "expected an integer, got bool"),
        ({"template": "base", "ttl_seconds": -5}, "ttl_seconds", "must not be negative, got -5"),
        ({"template": "base", "metadata": {"n": 1}}, "metadata.n", "expected a string, got int"),
        ({"template": "base", "env": ["A=1"]}, "env", "expected an object, got list"),
        ({"template": "base", "env": {"A": None}}, "env.A", "expected a string, got null"),
        (
            {"template": "base", "no_redirect": "yes"},
            "no_redirect",
            "expected true or false, got str",
        ),
    ],
)
def test_a_bad_claim_request_names_the_field(
    body: dict[str, Any], field: str, problem: str
) -> None:
    with pytest.raises(WireError) as error:
        ClaimRequest.from_json(body)
    assert (error.value.field, error.value.problem) == (field, problem)


def test_an_env_error_never_repeats_the_value() -> None:
    with pytest.raises(WireError) as error:
        ClaimRequest.from_json({"template": "base", "env": {"TOKEN": ["hunter2"]}})
    assert "hunter2" not in str(error.value)


@pytest.mark.parametrize(
    ("model", "body", "field", "problem"),
    [
        (RenewRequest, {"ttl": 5}, "ttl", "unknown field"),
        (RenewRequest, {"on_expire": 1}, "on_expire", "expected a string, got int"),
        (PoolsUpdate, {}, "pools", "required"),
        (PoolsUpdate, {"pools": [{"template": "base"}]}, "pools[0].warm", "required"),
        (PoolsUpdate, {"pools": [{"template": "b", "warm": -1}]}, "pools[0].warm",
         "must not be negative, got -1"),
        (PoolsUpdate, {"pools": [{"warm": 1}]}, "pools[0].template", "required"),
        (PoolsUpdate, {"pools": [{"template": "b", "warm": 1, "x": 0}]}, "pools[0].x",
         "unknown field"),
    ],
)  # fmt: skip
def test_other_request_bodies_are_read_strictly(
    model: Any, body: dict[str, Any], field: str, problem: str
) -> None:
    with pytest.raises(WireError) as error:
        model.from_json(body)
    assert (error.value.field, error.value.problem) == (field, problem)


def test_answers_ignore_unknown_fields_and_take_defaults() -> None:
    info = AgentInfo.from_json({"node": "n", "zones": ["a"]})
    assert info == AgentInfo("n")
    row = SandboxRow.from_json({"id": "sb_1", "key": {"template": "base"}, "state": "running"})
    assert (row.key, row.token, row.metadata, row.archived) == (PoolKey("base"), UNSET, {}, UNSET)
    grant = ClaimGrant.from_json(
        {"id": "sb_1", "token": "t", "sandbox": {"id": "sb_1", "key": {"template": "b"}}}
    )
    assert grant.sandbox is not None
    assert grant.sandbox.id == "sb_1"
    with pytest.raises(WireError, match=r"sandbox\.key: expected an object"):
        ClaimGrant.from_json({"id": "sb_1", "token": "t", "sandbox": {"id": "sb_1"}})

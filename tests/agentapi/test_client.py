"""The agent client over httpx.MockTransport: what goes on the wire, and how every failure
becomes one of the agent API's errors."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from datetime import UTC, datetime

import httpx
import pytest

from sandboxctl.agentapi import (
    AgentAnswerError,
    AgentApiError,
    AgentClient,
    AgentError,
    AgentUnreachable,
    ClaimRequest,
    InvalidId,
    PoolTarget,
)
from sandboxctl.agentapi.ids import MAX_ID_LENGTH
from sandboxctl.core.model import PoolKey
from tests.sandboxd.servers import free_port

ROW = {
    "id": "sb_0123456789ab",
    "key": {"template": "base", "net": "none", "size": "small"},
    "deadline": "2026-11-30T04:05:00Z",
    "claimed_at": "2026-11-30T04:00:00Z",
    "hibernated": False,
    "claim_ref": "team/a",
    "metadata": {},
    "cpu_count": 1,
    "mem_total_bytes": 536870912,
    "token": "t0k3n",
}


class Recorder:
    """A stand-in agent: answers every request with ``answer`` and keeps what it got."""

    def __init__(self, answer: Callable[[httpx.Request], httpx.Response] | None = None) -> None:
        self.requests: list[httpx.Request] = []
        self._answer = answer or (lambda request: httpx.Response(200, json=ROW))

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self._answer(request)

    def client(self, token: str | None = "root") -> AgentClient:
        return AgentClient("10.0.0.1:7777", token, transport=httpx.MockTransport(self))


@pytest.fixture
def agent() -> Recorder:
    return Recorder()


def test_each_verb_goes_to_its_route_with_the_ids_escaped(agent: Recorder) -> None:
    with agent.client() as client:
        client.get("sb_0123456789ab")
        client.release("sb-0123.ab", token="own")
        client.hibernate("SB_X")
        client.wake("sb_x")
    paths = [(r.method, r.url.raw_path.decode()) for r in agent.requests]
    assert paths == [
        ("GET", "/v1/sandboxes/sb_0123456789ab"),
        ("POST", "/v1/sandboxes/sb-0123.ab/release"),
        ("POST", "/v1/sandboxes/SB_X/hibernate"),
        ("POST", "/v1/sandboxes/sb_x/wake"),
    ]
    assert agent.requests[0].headers["authorization"] == "Bearer root"
    assert agent.requests[1].headers["authorization"] == "Bearer own"


def test_ids_are_escaped_as_one_path_segment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every id the rule admits is also escaped, so a wider rule could not split a path."""
    from sandboxctl.agentapi import client as module

    monkeypatch.setattr(module, "id_problem", lambda sandbox_id: None)
    agent = Recorder()
    with agent.client() as client:
        client.release("a/b c%d?e")
    assert agent.requests[0].url.raw_path == b"/v1/sandboxes/a%2Fb%20c%25d%3Fe/release"


@pytest.mark.parametrize(
    ("sandbox_id", "problem"),
    [
        ("", "is empty"),
        ("s" * (MAX_ID_LENGTH + 1), f"longer than {MAX_ID_LENGTH}"),
        ("sb_1/release", "may hold only"),
        ("..", "may hold only"),
        (".hidden", "may hold only"),
        ("sb 1", "may hold only"),
        ("sb_1\n", "may hold only"),
        ("sb_1\x00", "may hold only"),
        ("sb%2F1", "may hold only"),
        ("sb_ü", "may hold only"),
    ],
)
def test_an_id_that_cannot_be_one_is_a_404_before_any_request(
    agent: Recorder, sandbox_id: str, problem: str
) -> None:
    with agent.client() as client:
        for call in (client.get, client.release, client.hibernate, client.wake):
            with pytest.raises(InvalidId) as refused:
                call(sandbox_id)
            assert refused.value.status == 404
            assert problem in refused.value.message
            assert isinstance(refused.value, AgentError)
        with pytest.raises(InvalidId):
            client.renew(sandbox_id, 60)
    assert agent.requests == []


def test_the_longest_id_is_still_asked_for(agent: Recorder) -> None:
    with agent.client() as client:
        client.get("s" * MAX_ID_LENGTH)
    assert len(agent.requests) == 1


def test_claim_sends_the_request_model_and_reads_the_grant() -> None:
    def grant(request: httpx.Request) -> httpx.Response:
        body = {"id": "sb_1", "token": "t", "deadline": "2026-11-30T04:05:00Z"}
        return httpx.Response(200, json={**body, "owner_addr": "10.0.0.1:7777"})

    agent = Recorder(grant)
    request = ClaimRequest("base", size="medium", claim_ref="ns/a", metadata={"k": "v"})
    with agent.client() as client:
        granted = client.claim(request)
        client.claim(ClaimRequest("base", env={"A": "1"}))
    assert (granted.id, granted.token, granted.owner_addr) == ("sb_1", "t", "10.0.0.1:7777")
    assert granted.deadline == datetime(2026, 11, 30, 4, 5, tzinfo=UTC)
    sent = [json.loads(r.content) for r in agent.requests]
    assert sent[0] == {
        "template": "base",
        "net": "none",
        "size": "medium",
        "ttl_seconds": 0,
        "claim_ref": "ns/a",
        "metadata": {"k": "v"},
        "on_expire": "destroy",
    }, "no env key when there is none: an agent from before claim env refuses it"
    assert sent[1]["env"] == {"A": "1"}


def test_renew_pools_and_listing_send_and_read_models() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/renew"):
            return httpx.Response(200, json={"deadline": "2026-11-30T05:00:00Z"})
        if request.url.path == "/v1/pools":
            return httpx.Response(200, json={"node": "n1", "advertise_addr": "a:1"})
        return httpx.Response(200, json={"sandboxes": [ROW]})

    agent = Recorder(answer)
    with agent.client() as client:
        renewed = client.renew("sb_1", 90, on_expire="pause")
        info = client.set_pools([PoolTarget.of(PoolKey("base", size="medium"), 2)])
        rows = client.sandboxes(claim_ref="team/a")
    assert renewed.deadline == datetime(2026, 11, 30, 5, 0, tzinfo=UTC)
    assert info.node == "n1"
    assert [row.id for row in rows] == [ROW["id"]]
    renew, pools, listing = agent.requests
    assert json.loads(renew.content) == {"ttl_seconds": 90, "on_expire": "pause"}
    assert json.loads(pools.content) == {
        "pools": [{"template": "base", "net": "none", "size": "medium", "warm": 2}]
    }
    assert listing.url.params["claim_ref"] == "team/a"


@pytest.mark.parametrize(
    ("response", "status", "message"),
    [
        (httpx.Response(404, json={"error": "sandbox 'sb_1' not found"}), 404, "sandbox 'sb_1'"),
        (httpx.Response(429, json={"error": " node n1 is at capacity\n"}), 429, "node n1 is at"),
        (httpx.Response(502, text="Bad Gateway"), 502, "Bad Gateway"),
        (httpx.Response(500, json=["not", "an", "object"]), 500, '["not","an","object"]'),
    ],
)
def test_an_error_status_is_an_agent_error_with_its_message(
    response: httpx.Response, status: int, message: str
) -> None:
    agent = Recorder(lambda request: response)
    with agent.client() as client, pytest.raises(AgentError) as failed:
        client.get("sb_1")
    assert (failed.value.status, failed.value.address) == (status, "10.0.0.1:7777")
    assert failed.value.message.startswith(message)
    assert str(failed.value).startswith(f"sandboxd 10.0.0.1:7777: {status} ")


@pytest.mark.parametrize(
    ("response", "field", "problem"),
    [
        (httpx.Response(200, text="<html>"), "sandbox", "the answer is not JSON"),
        (httpx.Response(200, json=[]), "", "expected an object, got list"),
        (httpx.Response(200, json={**ROW, "key": None}), "key", "expected an object, got null"),
    ],
)
def test_an_answer_that_breaks_the_api_names_the_field(
    response: httpx.Response, field: str, problem: str
) -> None:
    agent = Recorder(lambda request: response)
    with agent.client() as client, pytest.raises(AgentAnswerError) as failed:
        client.get("sb_1")
    assert (failed.value.field, failed.value.problem) == (field, problem)
    assert failed.value.address == "10.0.0.1:7777"


def _raising(error: Exception) -> Recorder:
    def fail(request: httpx.Request) -> httpx.Response:
        raise error

    return Recorder(fail)


def _transport_errors() -> list[type[httpx.TransportError]]:
    """Every concrete transport error httpx has: a new one must map too."""
    found: list[type[httpx.TransportError]] = []
    pending: list[type[httpx.TransportError]] = [httpx.TransportError]
    while pending:
        kind = pending.pop()
        pending.extend(kind.__subclasses__())
        if not kind.__subclasses__():
            found.append(kind)
    return sorted(found, key=lambda kind: kind.__name__)


BEFORE_SENDING = {httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout}


@pytest.mark.parametrize("kind", _transport_errors(), ids=lambda kind: kind.__name__)
def test_every_transport_error_is_unreachable_and_says_if_it_was_sent(
    kind: type[httpx.TransportError],
) -> None:
    with _raising(kind("boom")).client() as client, pytest.raises(AgentUnreachable) as failed:
        client.info()
    assert isinstance(failed.value, AgentApiError)
    assert isinstance(failed.value.__cause__, kind)
    assert failed.value.undelivered is (kind in BEFORE_SENDING)
    assert failed.value.address == "10.0.0.1:7777"


@pytest.mark.services  # real sockets on loopback
def test_a_timeout_and_a_refusal_have_short_reasons() -> None:
    with (
        _raising(httpx.ReadTimeout("read")).client() as client,
        pytest.raises(AgentUnreachable) as timed_out,
    ):
        client.info()
    assert (timed_out.value.reason, timed_out.value.undelivered) == ("timed out", False)

    nobody = f"127.0.0.1:{free_port()}"  # nothing listens there
    with AgentClient(nobody, "root") as client, pytest.raises(AgentUnreachable) as refused:
        client.claim(ClaimRequest("base"))
    assert (refused.value.reason, refused.value.undelivered) == ("connection refused", True)


@pytest.mark.services  # a hung listener on loopback
def test_a_hung_agent_times_out_after_sending() -> None:
    with socket.socket() as sock:  # accepts (the kernel's backlog) and never answers
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        with (
            AgentClient(address, "root", timeout=0.2) as client,
            pytest.raises(AgentUnreachable) as hung,
        ):
            client.claim(ClaimRequest("base"))
    assert (hung.value.reason, hung.value.undelivered) == ("timed out", False)

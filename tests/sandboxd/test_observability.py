"""What an operator sees of a real agent: one log line per lifecycle event, naming the
sandbox as the SDK does, and request latency histograms by route template."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator

import httpx
import pytest

from sandboxctl.agentapi import AgentClient, ClaimRequest
from sandboxctl.clock import ManualClock
from sandboxctl.core.ids import public_id
from sandboxctl.core.model import PoolKey
from sandboxctl.sandboxd.agent import Agent
from tests.sandboxd.servers import serving

ROOT = "root-token-for-tests"
HISTOGRAM = "sandboxctl_http_request_duration_seconds"


def _lifecycle_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "sandboxctl.sandboxd" and r.getMessage().startswith("sandbox ")
    ]


def test_each_lifecycle_event_logs_one_line_with_the_sdk_id(
    make_agent: Callable[..., Agent], clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    agent: Agent = make_agent(pools={})
    caplog.set_level(logging.INFO, logger="sandboxctl.sandboxd")

    held = agent.claim(ClaimRequest(template="base", claim_ref="team/held"))
    agent.hibernate(held.id)
    agent.wake(held.id)
    agent.release(held.id)
    lapsed = agent.claim(ClaimRequest(template="base", ttl_seconds=60))
    clock.advance(61)
    assert agent.reap() == [(lapsed.id, "destroyed")]

    first, second = public_id(held.id), public_id(lapsed.id)
    assert held.id.startswith("sb_")  # the agents' spelling
    assert first.startswith("sb-")  # the SDK's
    assert _lifecycle_lines(caplog) == [
        f"sandbox {first} created (for a claim, template base)",
        f"sandbox {first} claimed by team/held",
        f"sandbox {first} paused",
        f"sandbox {first} resumed",
        f"sandbox {first} killed",
        f"sandbox {second} created (for a claim, template base)",
        f"sandbox {second} claimed by a client",
        f"sandbox {second} expired: destroyed",
    ]


def test_a_warm_start_and_its_claim_log_once_each(
    make_agent: Callable[..., Agent], caplog: pytest.LogCaptureFixture
) -> None:
    agent: Agent = make_agent(pools={PoolKey("base"): 1})
    caplog.set_level(logging.INFO, logger="sandboxctl.sandboxd")
    assert agent.refill_once() == 1
    record = agent.claim(ClaimRequest(template="base"))

    sdk_id = public_id(record.id)
    assert _lifecycle_lines(caplog) == [
        f"sandbox {sdk_id} created (warm, template base)",
        f"sandbox {sdk_id} claimed by a client",
    ]


@pytest.fixture
def address(agent: Agent) -> Iterator[str]:
    with serving(agent, ROOT) as address:
        yield address


def _series(text: str, suffix: str) -> dict[str, float]:
    """``{labels: value}`` of one series of the histogram (``_count``, ``_bucket``...)."""
    pattern = rf"^{HISTOGRAM}{suffix}\{{(.*)\}} ([0-9.e+]+)$"
    return {m.group(1): float(m.group(2)) for m in re.finditer(pattern, text, re.MULTILINE)}


def test_requests_are_timed_by_route_template_never_by_sandbox_id(address: str) -> None:
    with AgentClient(address, ROOT) as client:
        claimed = client.claim(ClaimRequest("base"))
        client.get(claimed.id)
        client.get(claimed.id)
        auth = {"Authorization": f"Bearer {ROOT}"}
        assert httpx.get(f"http://{address}/v2/{claimed.id}", headers=auth).status_code == 404
        envd = f"http://{address}/v1/sandboxes/{claimed.id}/envd/health"
        assert httpx.get(envd, headers=auth).status_code == 204
        text = client.metrics()

    counts = _series(text, "_count")
    route = 'method="{}",route="{}",service="sandboxd",status="{}"'
    assert counts[route.format("POST", "/v1/claim", 200)] == 1
    assert counts[route.format("GET", "/v1/sandboxes/{sandbox_id}", 200)] == 2
    assert counts[route.format("GET", "unmatched", 404)] == 1
    assert counts[route.format("GET", "/v1/sandboxes/{sandbox_id}/envd/health", 204)] == 1
    infinite = [key for key in _series(text, "_bucket") if 'le="+Inf"' in key]
    assert any('route="/v1/claim"' in key for key in infinite)
    for sdk_or_agent_id in (claimed.id, public_id(claimed.id)):
        assert sdk_or_agent_id not in "\n".join(
            line for line in text.splitlines() if line.startswith(HISTOGRAM)
        )

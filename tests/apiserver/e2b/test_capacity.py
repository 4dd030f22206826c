"""Creates never fail for want of a warm sandbox while the fleet has room: with every
warm pool drained they start cold; with every node full they get e2b's 429."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from e2b import AsyncSandbox, Sandbox
from e2b.exceptions import RateLimitException

from sandboxctl.agentapi import ClaimRequest
from tests.apiserver.e2b.stack import BASE, KEY_A, WARM, Stack
from tests.sandboxd.servers import wait_until


@pytest.fixture
def drained(stack: Stack) -> Iterator[Stack]:
    """Every node's warm pool drained (and listed so), refilled at the end."""
    for agent in stack.agents.values():
        agent.set_pools({})
    wait_until(lambda: not stack.store.warm_candidates(BASE), what="no warm sandbox listed")
    try:
        yield stack
    finally:
        for agent in stack.agents.values():
            agent.set_pools({BASE: WARM})


def test_creates_with_no_warm_sandbox_anywhere_start_cold(drained: Stack) -> None:
    async def create_all() -> list[str]:
        sandboxes = await asyncio.gather(*(AsyncSandbox.create(**drained.sdk()) for _ in range(6)))
        return [sandbox.sandbox_id for sandbox in sandboxes]

    ids = asyncio.run(create_all())
    try:
        assert len(set(ids)) == 6
        live = {sandbox_id.replace("-", "_") for sandbox_id in ids}
        assert live <= drained.live_ids()
    finally:
        for sandbox_id in ids:
            Sandbox.kill(sandbox_id, **drained.sdk())


def test_with_every_node_full_a_create_is_e2bs_429(drained: Stack) -> None:
    fillers: list[tuple[str, str]] = []
    try:
        for node, agent in drained.agents.items():
            free = agent.settings.max_sandboxes - agent.info().claimed
            fillers += [(node, agent.claim(ClaimRequest(template="base")).id) for _ in range(free)]
        with pytest.raises(RateLimitException, match="at capacity"):
            Sandbox.create(**drained.sdk())
        reply = httpx.post(
            f"{drained.api_url}/v2/sandboxes",
            json={"templateID": "base"},
            headers={"X-API-Key": KEY_A},
        )
        assert reply.status_code == 429
        assert reply.headers["should-retry"] == "false"
        body = reply.json()
        assert body["code"] == 429
        assert "every node that serves template 'base' is full" in body["message"]
    finally:
        for node, sandbox_id in fillers:
            drained.agents[node].release(sandbox_id)

"""A real agent (bubblewrap sandboxes, a root token) on loopback, for the envd tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandboxctl.agentapi import ClaimRequest
from sandboxctl.sandboxd.agent import Agent, AgentSettings
from tests.conftest import process_slot
from tests.envd.wire import Envd
from tests.sandboxd.servers import sandboxes_unavailable, serving

ROOT = "envd-root-token"
# A uid block of its own per session, away from the other test packages' blocks.
UID_BASE = 1_500_000 + process_slot() * 40


@dataclass
class Host:
    agent: Agent
    address: str

    def claim(self, env: dict[str, str] | None = None) -> Envd:
        record = self.agent.claim(ClaimRequest(template="base", env=env or {}))
        return Envd(self.address, record.id, record.token)


@pytest.fixture(scope="session")
def host() -> Iterator[Host]:
    reason = sandboxes_unavailable()
    if reason:
        pytest.skip(reason)
    state = Path(tempfile.mkdtemp(prefix="sandboxctl-envd-", dir="/tmp"))
    state.chmod(0o711)
    settings = AgentSettings(
        node="n1",
        advertise_addr="127.0.0.1:7777",
        state_dir=state,
        max_sandboxes=12,
        uid_base=UID_BASE,
    )
    from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime

    agent = Agent(settings, BubblewrapRuntime())
    try:
        with serving(agent, ROOT) as address:
            yield Host(agent, address)
    finally:
        agent.stop(destroy=True)
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def shared(host: Host) -> Envd:
    """One sandbox for the tests that do not mind sharing it."""
    return host.claim()


@pytest.fixture
def fresh(host: Host) -> Iterator[Envd]:
    """A sandbox of the test's own, released at the end."""
    envd = host.claim()
    yield envd
    host.agent.release(envd.sandbox_id)

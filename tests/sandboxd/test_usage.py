"""Usage samples and the sandbox log: what the agent records, and its API over them."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import httpx
import pytest

from sandboxctl.agentapi import AgentClient, AgentError, ClaimRequest
from sandboxctl.envd.host import Command
from sandboxctl.sandboxd import entering
from sandboxctl.sandboxd.agent import Agent
from sandboxctl.sandboxd.events import EventLog
from tests.sandboxd.servers import serving, wait_until

ROOT = "root-token-for-usage"


def run_inside(agent: Agent, sandbox_id: str, script: str) -> subprocess.Popen[bytes]:
    record = agent.get(sandbox_id)
    entry = agent.runtime.enter(
        agent.spec(record), agent.identity(record), Command(["/bin/sh", "-c", script])
    )
    return entering.popen(entry)


def test_samples_read_cgroup_cpu_and_memory_and_the_homes_disk(make_agent) -> None:  # type: ignore[no-untyped-def]
    agent: Agent = make_agent(pools={})
    sandbox = agent.claim(ClaimRequest(template="base"))
    assert agent.usage.sample_once() == 1
    writer = run_inside(agent, sandbox.id, "head -c 3000000 /dev/urandom >/home/user/blob")
    assert writer.wait(timeout=20) == 0
    # busy for a while, holding 40 MB of memory
    burner = run_inside(
        agent, sandbox.id, "python3 -c 'b = bytearray(40 << 20)\nwhile True: b[0] ^= 1'"
    )
    try:
        wait_until(
            lambda: (
                agent.usage.sample_once()
                and agent.usage.samples(sandbox.id)[-1].mem_used > 30 << 20
            ),
            what="the burner's memory to be counted",
        )
        newest = agent.usage.samples(sandbox.id)[-1]
    finally:
        burner.kill()
        burner.wait()
    assert newest.cpu_used_pct > 10
    assert newest.cpu_count == 1
    assert newest.mem_total == 512 << 20
    assert newest.disk_used >= 3_000_000
    assert newest.disk_total > newest.disk_used
    assert agent.usage.cost.samples >= 2
    assert agent.usage.cost.cpu_us_per_sample > 0


def test_the_ring_is_bounded_and_a_gone_sandbox_is_forgotten(make_agent) -> None:  # type: ignore[no-untyped-def]
    agent: Agent = make_agent(pools={}, usage_ring=3)
    sandbox = agent.claim(ClaimRequest(template="base"))
    for _ in range(5):
        agent.usage.sample_once()
    assert len(agent.usage.samples(sandbox.id)) == 3
    agent.release(sandbox.id)
    assert agent.usage.sample_once() == 0
    assert agent.usage.samples(sandbox.id) == []
    assert agent.usage.latest() == {}


def test_the_log_keeps_the_newest_events_and_the_newest_gone_sandboxes() -> None:
    log = EventLog(per_sandbox=3, keep_gone=2, now=lambda: 1.0)
    for i in range(5):
        log.record("a", f"event {i}", claim_ref="ns/a")
    found = log.events("a")
    assert found is not None
    assert [e.message for e in found[1]] == ["event 2", "event 3", "event 4"]
    log.record("warm", "sandbox created")
    log.gone("warm")
    assert log.events("warm") is None  # never claimed: nobody may ask for it
    for name in ("a", "b", "c"):
        log.record(name, "sandbox claimed", claim_ref=f"ns/{name}")
        log.gone(name)
    assert log.events("a") is None  # the oldest gone one went first
    assert log.events("c") is not None


@pytest.fixture
def served(make_agent) -> Iterator[tuple[Agent, AgentClient, str]]:  # type: ignore[no-untyped-def]
    agent: Agent = make_agent(pools={})
    with serving(agent, ROOT) as address, AgentClient(address, ROOT) as client:
        yield agent, client, address


def test_usage_over_the_api_and_404_once_released(served) -> None:  # type: ignore[no-untyped-def]
    agent, client, address = served
    sandbox = agent.claim(ClaimRequest(template="base", claim_ref="team/one"))
    for _ in range(3):
        agent.usage.sample_once()
    samples = client.usage(sandbox.id)
    assert len(samples) == 3
    assert client.usage(sandbox.id, latest=True) == samples[-1:]
    assert client.usage(sandbox.id, start=samples[-1].timestamp + 1) == []
    text = client.metrics()
    assert f'sandboxd_sandbox_memory_limit_bytes{{sandbox="{sandbox.id}"}}' in text
    # It names every tenant's sandboxes: nobody without the root token reads it.
    for offered in ({}, {"Authorization": f"Bearer {sandbox.token}"}):
        refused = httpx.get(f"http://{address}/metrics", headers=offered)
        assert refused.status_code == 401
        assert sandbox.id not in refused.text
    assert "sandboxd_usage_samples_total 3.0" in text
    bad = httpx.get(
        f"http://{address}/v1/sandboxes/{sandbox.id}/metrics?start=soon",
        headers={"Authorization": f"Bearer {ROOT}"},
    )
    assert bad.status_code == 400
    agent.release(sandbox.id)
    with pytest.raises(AgentError) as gone:
        client.usage(sandbox.id)
    assert gone.value.status == 404


def test_the_lifecycle_is_logged_and_kept_after_the_kill(served) -> None:  # type: ignore[no-untyped-def]
    agent, client, _ = served
    sandbox = agent.claim(ClaimRequest(template="base", claim_ref="team/one"))
    agent.hibernate(sandbox.id)
    agent.wake(sandbox.id)
    agent.release(sandbox.id)
    log = client.log(sandbox.id)
    assert log.claim_ref == "team/one"
    assert [e.message for e in log.events] == [
        "sandbox created",
        "sandbox claimed",
        "sandbox paused",
        "sandbox resumed",
        "sandbox killed",
    ]
    assert all(e.fields["sandboxID"] == sandbox.id for e in log.events)
    with pytest.raises(AgentError) as unknown:
        client.log("sb_000000000000")
    assert unknown.value.status == 404


def test_an_expired_lease_is_logged(make_agent, clock) -> None:  # type: ignore[no-untyped-def]
    agent: Agent = make_agent(pools={})
    sandbox = agent.claim(ClaimRequest(template="base", claim_ref="team/one", ttl_seconds=5))
    clock.advance(6)
    agent.reap()
    found = agent.events.events(sandbox.id)
    assert found is not None
    assert found[1][-1].message == "sandbox timed out: destroyed"

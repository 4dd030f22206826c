"""`sandboxctl serve-sandboxd` as a process: kill -9 and restart keeps every sandbox."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxctl.agentapi import AgentClient, ClaimRequest
from sandboxctl.sandboxd.agent import Agent, AgentSettings
from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime
from tests.envd.wire import Envd
from tests.sandboxd.servers import agent_process, free_port, wait_until, write_token

TOKEN = "crash-test-root-token"


@pytest.fixture(autouse=True)
def destroy_leftovers(state_dir: Path, uid_base: int) -> Iterator[None]:
    """Agents stopped without --destroy-on-exit leave sandboxes running, as they should;
    adopt and destroy them so no test leaves processes behind."""
    yield
    if (state_dir / "sd").exists():
        settings = AgentSettings(
            node="cleanup", advertise_addr="-", state_dir=state_dir / "sd", uid_base=uid_base
        )
        agent = Agent(settings, BubblewrapRuntime())
        agent.adopt()
        agent.stop(destroy=True)


def _args(state_dir: Path, port: int, uid_base: int, *extra: str) -> list[str]:
    token = write_token(state_dir / "token", TOKEN)
    return [
        "--node", "crashy", "--listen", f"127.0.0.1:{port}", "--state-dir", str(state_dir / "sd"),
        "--token-file", str(token), "--pool", "base=1", "--max-sandboxes", "8",
        "--uid-base", str(uid_base), *extra,
    ]  # fmt: skip


def test_kill_9_and_restart_keeps_every_sandbox(state_dir: Path, uid_base: int) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    args = _args(state_dir, port, uid_base)
    with agent_process(args, address) as agent:
        with AgentClient(address, TOKEN) as client:
            claimed = [
                client.claim(
                    ClaimRequest(
                        "base", claim_ref=f"t/{i}", metadata={"i": str(i)}, ttl_seconds=600
                    )
                )
                for i in range(3)
            ]
            before = {c.id: client.get(c.id) for c in claimed}
        agent.send_signal(signal.SIGKILL)
        agent.wait()

    # A restarted agent adopts only sandboxes whose processes still run: equal rows prove
    # every sandbox outlived its agent with the same id, token, deadline and metadata.
    with agent_process(args, address), AgentClient(address, TOKEN) as client:
        after = {row.id: client.get(row.id) for row in client.sandboxes()}
        assert after == before
        wait_until(lambda: client.info().pools[0].warm == 1, what="the warm pool")


def test_a_claims_env_survives_kill_9_and_reaches_commands(state_dir: Path, uid_base: int) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    args = _args(state_dir, port, uid_base)
    env = {"FOO": "bar baz", "SECRET": "s3cr3t"}
    with agent_process(args, address) as agent:
        with AgentClient(address, TOKEN) as client:
            claimed = client.claim(ClaimRequest("base", env=env))
        envd = Envd(address, claimed.id, TOKEN)
        assert envd.run('echo "$FOO|$SECRET"')["stdout"] == "bar baz|s3cr3t\n"
        agent.send_signal(signal.SIGKILL)
        agent.wait()

    with agent_process(args, address), AgentClient(address, TOKEN) as client:
        assert [row.id for row in client.sandboxes()] == [claimed.id]
        assert envd.run('echo "$FOO|$SECRET"')["stdout"] == "bar baz|s3cr3t\n"
        # a sandbox of the warm pool, claimed without env, gets none
        other = Envd(address, client.claim(ClaimRequest("base")).id, TOKEN)
        assert other.run('echo "$FOO|$SECRET"')["stdout"] == "|\n"


def test_sigterm_leaves_sandboxes_running_unless_destroy_on_exit(
    state_dir: Path, uid_base: int
) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    with agent_process(_args(state_dir, port, uid_base), address) as agent:
        with AgentClient(address, TOKEN) as client:
            sandbox_id = client.claim(ClaimRequest("base")).id
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0
    with agent_process(_args(state_dir, port, uid_base, "--destroy-on-exit"), address) as agent:
        with AgentClient(address, TOKEN) as client:
            assert [row.id for row in client.sandboxes()] == [sandbox_id]
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0
    with (
        agent_process(_args(state_dir, port, uid_base), address),
        AgentClient(address, TOKEN) as client,
    ):
        assert client.sandboxes() == []


def test_without_a_token_file_only_loopback_is_served(state_dir: Path) -> None:
    command = [
        sys.executable, "-m", "sandboxctl", "serve-sandboxd", "--listen", "0.0.0.0:0",
        "--state-dir", str(state_dir / "sd"),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "loopback only" in done.stderr
    assert "Traceback" not in done.stderr

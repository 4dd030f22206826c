"""``sandboxctl serve-proxy``: one-line startup errors, and a served proxy over a real agent."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx

from sandboxctl.sandboxd.agent import Agent, AgentSettings
from sandboxctl.sandboxd.api import create_app
from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime
from tests.apiserver.helpers import serving
from tests.cli.conftest import Run
from tests.sandboxd.servers import free_port, service_process, status_of, write_token


def test_the_domain_is_required(run: Run, tmp_path: Path) -> None:
    secret = write_token(tmp_path / "secret", "s")
    result = run("serve-proxy", "--e2b-envd-secret-file", str(secret), "--sandboxd-seeds", "a:1")
    assert result.code == 2
    [line] = result.err.strip().splitlines()
    assert line == "sandboxctl: error: serve-proxy needs --domain (the e2b API's --e2b-domain)"


def test_the_envd_secret_is_required(run: Run, tmp_path: Path) -> None:
    result = run("serve-proxy", "--domain", "d.test", "--sandboxd-seeds", "a:1")
    assert result.code == 2
    assert "needs --e2b-envd-secret-file" in result.err
    missing = tmp_path / "nope"
    result = run("serve-proxy", "--domain", "d.test", "--e2b-envd-secret-file", str(missing))
    assert result.code == 2
    assert f"--e2b-envd-secret-file {missing}: No such file or directory" in result.err


def test_mesh_needs_seeds_and_kube_needs_no_seeds(run: Run, tmp_path: Path) -> None:
    secret = write_token(tmp_path / "secret", "s")
    base = ("serve-proxy", "--domain", "d.test", "--e2b-envd-secret-file", str(secret))
    result = run(*base)
    assert result.code == 2
    assert "--sandboxd-seeds" in result.err
    result = run(*base, "--source", "kube", "--sandboxd-seeds", "a:1")
    assert result.code == 2
    assert "--sandboxd-seeds is for --source mesh" in result.err
    result = run(*base, "--source", "nats")
    assert result.code == 2
    assert "expected mesh or kube" in result.err


def test_it_serves_the_proxy_over_the_fleet(state_dir: Path, tmp_path: Path) -> None:
    agent = Agent(AgentSettings("n1", "127.0.0.1:1", state_dir), BubblewrapRuntime())
    token = write_token(tmp_path / "token", "root-token")
    secret = write_token(tmp_path / "secret", "envd-secret")
    port = free_port()
    try:
        with serving(create_app(agent, "root-token")) as agent_url:
            args = [
                *("--domain", "sandboxes.test", "--e2b-envd-secret-file", str(secret)),
                *("--sandboxd-seeds", agent_url.removeprefix("http://")),
                *("--sandboxd-token-file", str(token), "--inventory-poll", "200ms"),
                *("--listen", f"127.0.0.1:{port}"),
            ]
            url = f"http://127.0.0.1:{port}"
            with service_process(["serve-proxy", *args], f"{url}/healthz") as process:
                assert status_of(f"{url}/healthz") == 204
                headers = {
                    "E2b-Sandbox-Id": "sb-0123abcd",
                    "E2b-Sandbox-Port": "49983",
                    "X-Access-Token": "0" * 64,
                }
                response = httpx.get(f"{url}/health", headers=headers, timeout=5)
                assert response.status_code == 502
                assert response.json() == {
                    "code": 502,
                    "message": "The sandbox sb-0123abcd was not found",
                }
                process.send_signal(signal.SIGTERM)
                assert process.wait(timeout=20) == 0
    finally:
        agent.stop(destroy=True)

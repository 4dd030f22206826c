"""``sandboxctl serve-apiserver`` refuses a setup that cannot work, in one line, exit 2."""

from __future__ import annotations

import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import yaml

from sandboxctl.sandboxd.agent import Agent, AgentSettings
from sandboxctl.sandboxd.api import create_app
from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime
from tests.apiserver.conftest import ALL_SANDBOXES
from tests.apiserver.helpers import AUTH, KUBE_TOKEN, serving, watch
from tests.cli.conftest import Run
from tests.sandboxd.servers import free_port, wait_until, write_token


def test_source_flags_that_cannot_work_are_one_line(run: Run, tmp_path: Path) -> None:
    kubeconfig = str(tmp_path / "nothere")
    cases = {
        ("--source", "nats"): "--source 'nats': expected mesh or kube",
        ("--source", "kube", "--sandboxd-seeds", "a:7777"): "--sandboxd-seeds is for --source mesh",
        (
            "--source",
            "kube",
            "--kubeconfig",
            kubeconfig,
        ): f"--kubeconfig {kubeconfig}: no such file",
        (
            "--sandboxd-seeds",
            "a:7777",
            "--warm-pool-driver",
        ): "--warm-pool-driver needs --source kube",
    }
    for args, message in cases.items():
        result = run("serve-apiserver", *args)
        assert result.code == 2, args
        [line] = result.err.strip().splitlines()
        assert message in line


def test_mesh_needs_seeds(run: Run) -> None:
    result = run("serve-apiserver")
    assert result.code == 2
    assert "--sandboxd-seeds" in result.err


def test_no_answering_seed_is_one_line(run: Run, tmp_path: Path) -> None:
    seed = f"127.0.0.1:{free_port()}"
    tokens = write_token(tmp_path / "kube-tokens", f"{KUBE_TOKEN} *")
    result = run(
        "serve-apiserver", "--sandboxd-seeds", seed, "--inventory-poll", "1s",
        "--kube-token-file", str(tokens),
    )  # fmt: skip
    assert result.code == 2
    errors = [line for line in result.err.splitlines() if line.startswith("sandboxctl: error")]
    assert errors == [f"sandboxctl: error: no sandboxd seed answered: {seed} (connection refused)"]


def test_a_missing_token_file_is_one_line(run: Run, tmp_path: Path) -> None:
    missing = tmp_path / "token"
    result = run(
        "serve-apiserver", "--sandboxd-seeds", "a:1", "--sandboxd-token-file", str(missing)
    )
    assert result.code == 2
    assert f"--sandboxd-token-file {missing}: No such file or directory" in result.err


def test_it_serves_the_fleet_and_writes_a_kubeconfig(state_dir: Path, tmp_path: Path) -> None:
    agent = Agent(AgentSettings("n1", "127.0.0.1:1", state_dir), BubblewrapRuntime())
    token = write_token(tmp_path / "token", "root-token")
    kubeconfig = tmp_path / "kubeconfig"
    try:
        with serving(create_app(agent, "root-token")) as agent_url:
            args = [
                "--sandboxd-seeds",
                agent_url.removeprefix("http://"),
                "--sandboxd-token-file",
                str(token),
                "--inventory-poll",
                "200ms",
                "--listen",
                "127.0.0.1:0",
                "--kubeconfig-out",
                str(kubeconfig),
                "--kube-token-file",
                str(write_token(tmp_path / "kube-tokens", f"{KUBE_TOKEN} *")),
            ]
            command = [sys.executable, "-m", "sandboxctl", "serve-apiserver", *args]
            with subprocess.Popen(command, stderr=subprocess.PIPE, text=True) as process:
                try:
                    wait_until(lambda: kubeconfig.exists() or process.poll() is not None)
                    assert process.poll() is None, process.stderr.read()  # type: ignore[union-attr]
                    config = yaml.safe_load(kubeconfig.read_text())
                    url = config["clusters"][0]["cluster"]["server"]
                    assert stat.S_IMODE(kubeconfig.stat().st_mode) == 0o600
                    assert config["users"][0]["user"] == {"token": KUBE_TOKEN}
                    listed = wait_until(lambda: _answer(f"{url}{ALL_SANDBOXES}"))
                    assert (listed["kind"], listed["items"]) == ("SandboxList", [])
                    # An open watch must not hold up the stop signal.
                    with (
                        httpx.Client(base_url=url, headers=AUTH) as http,
                        watch(http, ALL_SANDBOXES) as events,
                    ):
                        process.send_signal(signal.SIGTERM)
                        assert events.next(timeout=20) is None  # the server ended the watch
                        assert process.wait(timeout=20) == 0
                finally:
                    if process.poll() is None:
                        process.kill()
    finally:
        agent.stop(destroy=True)


def _answer(url: str) -> dict[str, Any] | None:
    try:
        return httpx.get(url, headers=AUTH, timeout=2).json()  # type: ignore[no-any-return]
    except httpx.HTTPError:
        return None

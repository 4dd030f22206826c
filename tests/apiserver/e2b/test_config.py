"""The key and alias files, E2bConfig, and the serve-apiserver e2b flags."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from sandboxctl.apiserver.e2b import (
    E2bConfig,
    load_api_keys,
    load_template_aliases,
)
from sandboxctl.core.errors import ConfigurationError
from sandboxctl.sandboxd.agent import Agent, AgentSettings
from sandboxctl.sandboxd.api import create_app
from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime
from tests.apiserver.helpers import serving
from tests.cli.conftest import Run
from tests.sandboxd.servers import (
    free_port,
    sandboxes_unavailable,
    service_process,
    status_of,
    wait_until,
    write_token,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "file"
    path.write_text(text)
    return path


def test_key_file(tmp_path: Path) -> None:
    path = write(tmp_path, "# keys\n\nk1\n  k2   team-b  # a comment\nk3 other\n")
    assert load_api_keys(path) == {"k1": "default", "k2": "team-b", "k3": "other"}
    assert load_api_keys(path, namespace="ns")["k1"] == "ns"


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("k1\nk2 ns extra\n", 2, "3 fields"),
        ("k1\n# c\nk1 ns\n", 3, "duplicate API key"),
    ],
)
def test_key_file_errors_name_the_line(tmp_path: Path, text: str, line: int, problem: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigurationError, match=f"{path}:{line}: .*{problem}"):
        load_api_keys(path)


def test_a_missing_file_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="No such file"):
        load_api_keys(tmp_path / "nope")
    with pytest.raises(ConfigurationError, match="No such file"):
        load_template_aliases(tmp_path / "nope")


def test_alias_file(tmp_path: Path) -> None:
    path = write(tmp_path, "# aliases\nbase base\npy python large # big\n\nci base medium\n")
    assert load_template_aliases(path) == {
        "base": ("base", "small"),
        "py": ("python", "large"),
        "ci": ("base", "medium"),
    }


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("base base\nbase python\n", 2, "duplicate alias 'base'"),
        ("a b huge\n", 1, "size 'huge'"),
        ("lonely\n", 1, "1 field"),
        ("a b small extra\n", 1, "4 fields"),
    ],
)
def test_alias_file_errors_name_the_line(
    tmp_path: Path, text: str, line: int, problem: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigurationError, match=f"{path}:{line}: .*{problem}"):
        load_template_aliases(path)


def test_config_defaults_and_refusals() -> None:
    config = E2bConfig(domain="d", envd_secret=b"s", api_keys={"k": "default"})
    assert config.aliases["base"] == ("base", "small")
    assert config.aliases["code-interpreter-v1"] == ("base", "small")
    assert config.default_timeout == 300
    assert config.namespace == "default"
    assert E2bConfig(domain="d", envd_secret=b"s", api_keys={}, allow_anonymous=True)
    with pytest.raises(ConfigurationError, match="API keys"):
        E2bConfig(domain="d", envd_secret=b"s", api_keys={})
    with pytest.raises(ConfigurationError, match="domain"):
        E2bConfig(domain="", envd_secret=b"s", api_keys={"k": "d"})


@pytest.mark.parametrize(
    ("extra", "missing"),
    [
        (["--e2b-allow-anonymous"], "needs --e2b-domain"),
        (["--e2b-allow-anonymous", "--e2b-domain", "d"], "needs --e2b-envd-secret-file"),
    ],
)
def test_serve_apiserver_names_the_missing_e2b_flag(
    run: Run, extra: list[str], missing: str
) -> None:
    result = run("serve-apiserver", "--sandboxd-seeds", "127.0.0.1:1", *extra)
    assert result.code == 2
    errors = [line for line in result.err.splitlines() if line.startswith("sandboxctl: error")]
    assert len(errors) == 1
    assert missing in errors[0]


def test_serve_apiserver_reports_a_bad_alias_file(run: Run, tmp_path: Path) -> None:
    secret = write_token(tmp_path / "secret", "s3cret")
    aliases = tmp_path / "aliases"
    aliases.write_text("base base\nbase base\n")
    result = run(
        "serve-apiserver", "--sandboxd-seeds", "127.0.0.1:1", "--e2b-allow-anonymous",
        "--e2b-domain", "d", "--e2b-envd-secret-file", str(secret),
        "--e2b-template-alias-file", str(aliases),
    )  # fmt: skip
    assert result.code == 2
    assert f"{aliases}:2: duplicate alias 'base'" in result.err


@pytest.mark.skipif(sandboxes_unavailable() is not None, reason=str(sandboxes_unavailable()))
def test_serve_apiserver_serves_e2b_beside_the_kube_api(state_dir: Path, tmp_path: Path) -> None:
    agent = Agent(AgentSettings("n1", "127.0.0.1:1", state_dir), BubblewrapRuntime())
    token = write_token(tmp_path / "token", "root-token")
    secret = write_token(tmp_path / "secret", "envd-secret")
    keys = tmp_path / "keys"
    keys.write_text("e2b_key team\n")
    kubeconfig = tmp_path / "kubeconfig"
    e2b_port = free_port()
    try:
        with serving(create_app(agent, "root-token")) as agent_url:
            command = [
                "serve-apiserver",
                "--sandboxd-seeds", agent_url.removeprefix("http://"),
                "--sandboxd-token-file", str(token), "--inventory-poll", "200ms",
                "--listen", "127.0.0.1:0", "--kubeconfig-out", str(kubeconfig),
                "--e2b-listen", f"127.0.0.1:{e2b_port}", "--e2b-api-key-file", str(keys),
                "--e2b-domain", "example.test", "--e2b-envd-secret-file", str(secret),
                "--kube-token-file", str(write_token(tmp_path / "kube-tokens", "kube-token *")),
            ]  # fmt: skip
            url = f"http://127.0.0.1:{e2b_port}"
            with service_process(command, f"{url}/health") as process:
                assert status_of(f"{url}/health") == 204
                wait_until(kubeconfig.exists)
                listed = httpx.get(f"{url}/v2/sandboxes", headers={"X-API-Key": "e2b_key"})
                assert (listed.status_code, listed.json()) == (200, [])
                assert httpx.get(f"{url}/v2/sandboxes").status_code == 401
                process.send_signal(signal.SIGTERM)
                assert process.wait(timeout=20) == 0
    finally:
        agent.stop(destroy=True)


@pytest.mark.skipif(sandboxes_unavailable() is not None, reason=str(sandboxes_unavailable()))
def test_listeners_bound_to_every_address_each_serve_their_own_api(
    state_dir: Path, tmp_path: Path
) -> None:
    """Requests go to the app of the port they arrived on: a socket on 0.0.0.0 sees the
    local address the client picked, never the address it was bound to."""
    agent = Agent(AgentSettings("n1", "127.0.0.1:1", state_dir), BubblewrapRuntime())
    token = write_token(tmp_path / "token", "root-token")
    secret = write_token(tmp_path / "secret", "envd-secret")
    keys = tmp_path / "keys"
    keys.write_text("e2b_key team\n")
    kube_port, e2b_port = free_port(), free_port()
    try:
        with serving(create_app(agent, "root-token")) as agent_url:
            command = [
                "serve-apiserver",
                "--sandboxd-seeds", agent_url.removeprefix("http://"),
                "--sandboxd-token-file", str(token), "--inventory-poll", "200ms",
                "--listen", f"0.0.0.0:{kube_port}",
                "--e2b-listen", f"0.0.0.0:{e2b_port}", "--e2b-api-key-file", str(keys),
                "--e2b-domain", "example.test", "--e2b-envd-secret-file", str(secret),
                "--kube-token-file", str(write_token(tmp_path / "kube-tokens", "kube-token *")),
            ]  # fmt: skip
            e2b = f"http://127.0.0.1:{e2b_port}"
            with service_process(command, f"{e2b}/health"):
                assert status_of(f"{e2b}/health") == 204  # the e2b API's own route
                kube = f"http://127.0.0.1:{kube_port}"
                assert status_of(f"{kube}/health") == 401  # the Sandbox API's: no token
                assert status_of(f"{kube}/readyz") == 200
    finally:
        agent.stop(destroy=True)

"""The Sandbox API serves only the holders of a token,
each in its namespaces, and over HTTPS when given a certificate (kubectl through it)."""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from sandboxctl.apiserver import create_kube_app
from sandboxctl.apiserver.auth import KubeTokens, load_kube_tokens
from sandboxctl.core.errors import ConfigurationError
from sandboxctl.fleet.certificate import fleet_certificate
from sandboxctl.sandboxd.agent import Agent, AgentSettings
from sandboxctl.sandboxd.api import create_app
from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime
from sandboxctl.store import SandboxStore
from tests.apiserver.conftest import ALL_SANDBOXES, GROUP_PATH, SANDBOXES
from tests.apiserver.helpers import serving
from tests.cli.conftest import Run
from tests.sandboxd.servers import (
    free_port,
    sandboxes_unavailable,
    service_process,
    write_token,
)

KUBECTL = Path(__file__).resolve().parents[2] / ".tools" / "bin" / "kubectl"
EVERYWHERE = "token-for-every-namespace"
TEAM = "token-for-team-a"
TEAM_SANDBOXES = f"{GROUP_PATH}/namespaces/team-a/sandboxes"
SANDBOX = {
    "apiVersion": "agents.x-k8s.io/v1beta1",
    "kind": "Sandbox",
    "metadata": {"name": "s1"},
    "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "base"}]}}},
}


@pytest.fixture
def url(store: SandboxStore) -> Iterator[str]:
    tokens = KubeTokens({EVERYWHERE: frozenset({"*"}), TEAM: frozenset({"team-a", "team-b"})})
    with serving(create_kube_app(store, tokens, watch_interval=0.02)) as base:
        yield base


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/version"),
        ("GET", "/apis"),
        ("GET", f"{GROUP_PATH}"),
        ("GET", ALL_SANDBOXES),
        ("GET", SANDBOXES),
        ("GET", f"{SANDBOXES}/a1"),
        ("POST", SANDBOXES),
        ("DELETE", f"{SANDBOXES}/a1"),
        ("GET", "/no/such/path"),
    ],
)
@pytest.mark.parametrize("headers", [{}, bearer("not-a-token"), {"Authorization": EVERYWHERE}])
def test_no_token_or_an_unknown_one_is_401(
    url: str, method: str, path: str, headers: dict[str, str]
) -> None:
    reply = httpx.request(method, url + path, headers=headers, json=SANDBOX)
    assert reply.status_code == 401
    status = reply.json()
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 401, "Unauthorized")
    assert reply.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize("path", ["/healthz", "/livez", "/readyz"])
def test_health_needs_no_token(url: str, path: str) -> None:
    reply = httpx.get(url + path)
    assert (reply.status_code, reply.text) == (200, "ok")


def test_a_token_acts_only_in_its_namespaces(url: str) -> None:
    team = bearer(TEAM)
    assert httpx.get(url + TEAM_SANDBOXES, headers=team).status_code == 200
    assert httpx.get(url + "/apis", headers=team).status_code == 200  # discovery: any token
    for method, path in [
        ("GET", SANDBOXES),
        ("GET", f"{SANDBOXES}/a1"),
        ("POST", SANDBOXES),
        ("DELETE", f"{SANDBOXES}/a1"),
        ("GET", ALL_SANDBOXES),  # across namespaces needs '*'
    ]:
        reply = httpx.request(method, url + path, headers=team, json=SANDBOX)
        assert reply.status_code == 403, (method, path)
        status = reply.json()
        assert (status["code"], status["reason"]) == (403, "Forbidden")
        assert "forbidden" in status["message"]
    everywhere = bearer(EVERYWHERE)
    listed = httpx.get(url + ALL_SANDBOXES, headers=everywhere).json()
    assert {item["metadata"]["name"] for item in listed["items"]} == {"a1", "a2", "b1", "t1"}
    assert httpx.get(f"{url}{SANDBOXES}/a1", headers=everywhere).status_code == 200


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("lonely\n", "a token needs the namespaces"),
        ("t1 *\nt1 team\n", ":2: the token is listed twice"),
        ("t1 Team_A\n", "'Team_A' is not a namespace name"),
        ("# nothing\n\n", "no tokens in the file"),
    ],
)
def test_a_bad_token_file_names_the_line(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "tokens"
    path.write_text(text)
    with pytest.raises(ConfigurationError, match=problem):
        load_kube_tokens(path)


def test_serve_apiserver_needs_a_token_file(run: Run) -> None:
    result = run("serve-apiserver", "--sandboxd-seeds", "127.0.0.1:1")
    assert result.code == 2
    [line] = [line for line in result.err.splitlines() if line.startswith("sandboxctl: error")]
    assert "needs --kube-token-file" in line


def test_half_a_tls_pair_or_a_mismatched_one_is_one_line(run: Run, tmp_path: Path) -> None:
    tokens = write_token(tmp_path / "tokens", f"{EVERYWHERE} *")
    cert, _ = self_signed(tmp_path / "a")
    _, other_key = self_signed(tmp_path / "b")
    base = ["serve-apiserver", "--sandboxd-seeds", "127.0.0.1:1", "--kube-token-file", str(tokens)]
    half = run(*base, "--tls-cert-file", str(cert))
    assert half.code == 2
    assert "--tls-cert-file and --tls-private-key-file go together" in half.err
    mismatched = run(*base, "--tls-cert-file", str(cert), "--tls-private-key-file", str(other_key))
    assert mismatched.code == 2
    assert "not a certificate and its private key" in mismatched.err


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, and its key (PEM files)."""
    directory.mkdir(parents=True, exist_ok=True)
    tls = fleet_certificate(directory, "127.0.0.1")
    return tls.cert_file, tls.key_file


@pytest.mark.skipif(
    sandboxes_unavailable() is not None or not KUBECTL.exists(),
    reason=str(sandboxes_unavailable() or "needs the pinned kubectl (make kubectl)"),
)
def test_kubectl_over_https_with_the_written_kubeconfig(state_dir: Path, tmp_path: Path) -> None:
    agent = Agent(AgentSettings("n1", "127.0.0.1:1", state_dir), BubblewrapRuntime())
    cert, key = self_signed(tmp_path / "tls")
    tokens = write_token(tmp_path / "tokens", f"{TEAM} team-a\n{EVERYWHERE} *")
    kubeconfig = tmp_path / "kubeconfig"
    root = write_token(tmp_path / "root", "root-token")
    try:
        with serving(create_app(agent, "root-token")) as agent_url:
            port = free_port()
            command = [
                "serve-apiserver", "--sandboxd-seeds", agent_url.removeprefix("http://"),
                "--sandboxd-token-file", str(root), "--inventory-poll", "200ms",
                "--listen", f"127.0.0.1:{port}", "--kubeconfig-out", str(kubeconfig),
                "--kube-token-file", str(tokens),
                "--tls-cert-file", str(cert), "--tls-private-key-file", str(key),
            ]  # fmt: skip
            ready = f"https://127.0.0.1:{port}/readyz"
            trust = ssl.create_default_context(cafile=str(cert))
            with service_process(command, ready, verify=trust):
                config = yaml.safe_load(kubeconfig.read_text())
                assert config["clusters"][0]["cluster"]["server"] == f"https://127.0.0.1:{port}"
                assert config["users"][0]["user"] == {"token": TEAM}  # the file's first
                kubectl = [str(KUBECTL), "--kubeconfig", str(kubeconfig)]
                kubectl += ["--cache-dir", str(tmp_path / "cache")]
                mine = _run([*kubectl, "get", "sandboxes", "-n", "team-a"])
                assert mine.returncode == 0, mine.stderr
                assert mine.stderr == "No resources found in team-a namespace.\n"
                other = _run([*kubectl, "get", "sandboxes", "-n", "default"])
                assert other.returncode == 1
                assert "Error from server (Forbidden)" in other.stderr
                stranger = _run([*kubectl, "--token", "not-a-token", "get", "sandboxes"])
                assert stranger.returncode == 1
                assert "You must be logged in to the server" in stranger.stderr
                # Plain HTTP to the HTTPS port is no way in either.
                with pytest.raises(httpx.HTTPError):
                    httpx.get(f"http://127.0.0.1:{port}{ALL_SANDBOXES}", timeout=5)
    finally:
        agent.stop(destroy=True)


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

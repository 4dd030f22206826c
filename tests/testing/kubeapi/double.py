"""The Kubernetes API double for tests: in this process (the ``kube`` fixture) or as a
process that can be stopped and started again (:class:`DoubleProcess`), kubeconfigs
for it, and kubectl runners (the pinned 1.35 and the machine's 1.32)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from kubernetes import client

from sandboxctl_testing.kubeapi import Running, start
from sandboxctl_testing.kubeapi.store import Store
from tests.sandboxd.servers import START_TIMEOUT, free_port, status_of, wait_until

REPO = Path(__file__).resolve().parents[3]
CRDS = REPO / "manifests" / "crds"
PINNED_KUBECTL = REPO / ".tools" / "bin" / "kubectl"
SECOND_KUBECTL_ENV = "SANDBOXCTL_SECOND_KUBECTL"


def second_kubectl() -> Path | None:
    """A second kubectl version: $SANDBOXCTL_SECOND_KUBECTL, else the 1.32 that the
    machine's Debian ``kubectl`` package (the Google Cloud SDK build) ships beside its
    dispatcher. None when neither is here."""
    named = os.environ.get(SECOND_KUBECTL_ENV)
    if named:
        return Path(named)
    found = shutil.which("kubectl")
    if found is None:
        return None
    candidate = Path(os.path.realpath(found)).parent / "kubectl.1.32"
    return candidate if candidate.is_file() else None


def write_kubeconfig(
    path: Path, url: str, token: str | None = None, namespace: str = "default"
) -> Path:
    user = f"{{token: {token}}}" if token else "{}"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f'clusters: [{{name: fake, cluster: {{server: "{url}"}}}}]\n'
        f"users: [{{name: fake, user: {user}}}]\n"
        "contexts: [{name: fake, context: {cluster: fake, user: fake, "
        f"namespace: {namespace}}}}}]\n"
        "current-context: fake\n",
        encoding="utf-8",
    )
    return path


def api_for(url: str, token: str | None = None) -> client.ApiClient:
    configuration = client.Configuration()
    configuration.host = url
    if token:
        configuration.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(configuration)


@dataclass
class Kube:
    """One running double: its URL, store (for the hooks), a client and a kubeconfig."""

    backend = "double"
    running: Running
    kubeconfig: Path
    api: client.ApiClient

    @property
    def url(self) -> str:
        return self.running.url

    @property
    def store(self) -> Store:
        return self.running.store

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10)


@pytest.fixture
def double_kube(tmp_path: Path) -> Iterator[Kube]:
    """The double, for the tests a real control plane cannot serve (each says why)."""
    running = start(0, crds=[CRDS], bookmark_seconds=0.2)
    api = api_for(running.url)
    try:
        yield Kube(running, write_kubeconfig(tmp_path / "kubeconfig", running.url), api)
    finally:
        api.close()
        running.stop()


class Kubectl:
    def __init__(self, binary: Path, kubeconfig: Path, home: Path) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.home = home

    def command(self, *args: str) -> list[str]:
        return [
            str(self.binary),
            f"--kubeconfig={self.kubeconfig}",
            f"--cache-dir={self.home / 'cache'}",
            "--request-timeout=10s",
            *args,
        ]

    def __call__(
        self, *args: str, stdin: str | None = None, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(self.home)}
        return subprocess.run(
            self.command(*args),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )

    def start(self, *args: str) -> subprocess.Popen[str]:
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(self.home)}
        return subprocess.Popen(
            self.command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )


class DoubleProcess:
    """``python -m sandboxctl_testing.kubeapi`` on a fixed port with a state file, so that
    it can be stopped (a control-plane outage) and started again where it was."""

    def __init__(
        self, state_dir: Path, port: int | None = None, token_file: Path | None = None
    ) -> None:
        self.port = port or free_port()
        self.state = state_dir / "kubeapi-state.json"
        self.token_file = token_file
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (kept across restarts, closed on exit)

    def start(self) -> None:
        command = [
            sys.executable,
            "-m",
            "sandboxctl_testing.kubeapi",
            "--port",
            str(self.port),
            "--state",
            str(self.state),
            "--crds",
            str(CRDS),
            "--bookmark-interval",
            "0.2",
        ]
        if self.token_file is not None:
            command += ["--token-file", str(self.token_file)]
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)
        process = self.process
        wait_until(
            lambda: status_of(f"{self.url}/healthz") == 200 or process.poll() is not None,
            timeout=START_TIMEOUT,
            what="the Kubernetes API double to answer",
        )
        if process.poll() is not None:
            self._log.seek(0)
            raise AssertionError(f"the double exited: {self._log.read().decode(errors='replace')}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=20)
        self.process = None

    def __enter__(self) -> DoubleProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stop()
        self._log.close()

"""``sandboxctl serve`` as a real process: the whole one-host fleet, its files, its stop."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx
import pytest
import yaml

from tests.sandboxd.servers import free_port, wait_until

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0
    or any(shutil.which(tool) is None for tool in ("bwrap", "setpriv", "nsenter")),
    reason="sandboxctl serve runs real sandboxes: it needs root and bubblewrap",
)

READY_TIMEOUT = 90.0
STOP_TIMEOUT = 30.0
UID_SPAN = 20  # the uid_base fixture's block per test
ONE_LINER = "from e2b import Sandbox; s = Sandbox.create(); print(s.sandbox_id); s.kill()"


def _e2b_served() -> bool:
    try:
        module = importlib.import_module("sandboxctl.apiserver.e2b")
    except ModuleNotFoundError:
        return False
    return hasattr(module, "create_e2b_app") and hasattr(module, "E2bConfig")


@dataclass
class Fleet:
    state_dir: Path
    ports: dict[str, int]
    uid_base: int
    process: subprocess.Popen[bytes]
    log: IO[bytes]

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(
                f"serve did not stop within {STOP_TIMEOUT}s:\n{self.output()}"
            ) from None


def _command(state_dir: Path, ports: dict[str, int], uid_base: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sandboxctl",
        "serve",
        "--state-dir",
        str(state_dir),
        "--host",
        "127.0.0.1",
        "--e2b-port",
        str(ports["e2b"]),
        "--proxy-port",
        str(ports["proxy"]),
        "--kube-port",
        str(ports["kube"]),
        "--sandboxd-port",
        str(ports["sandboxd"]),
        "--pool",
        "base=1",
        "--uid-base",
        str(uid_base),
    ]


@pytest.fixture
def start(state_dir: Path, uid_base: int) -> Iterator:  # type: ignore[type-arg]
    """Start ``sandboxctl serve`` on free ports and wait for its ``ready:`` line."""
    started: list[Fleet] = []
    ports = {name: free_port() for name in ("e2b", "proxy", "kube", "sandboxd")}
    fleet_dir = state_dir / "fleet"

    def run(*extra: str) -> Fleet:
        log = tempfile.TemporaryFile()  # noqa: SIM115 (closed at teardown)
        command = [*_command(fleet_dir, ports, uid_base), *extra]
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        fleet = Fleet(fleet_dir, ports, uid_base, process, log)
        started.append(fleet)

        def ready() -> bool:
            return process.poll() is not None or any(
                line.startswith("ready: ") for line in fleet.output().splitlines()
            )

        wait_until(ready, timeout=READY_TIMEOUT, interval=0.1, what="the ready line")
        assert process.poll() is None, f"serve exited with {process.returncode}:\n{fleet.output()}"
        return fleet

    yield run
    try:
        for fleet in started:
            if fleet.process.poll() is None:
                fleet.stop()  # SIGTERM: serve destroys its sandboxes (SIGKILL would not)
    finally:
        for fleet in started:
            fleet.log.close()
        for pid in _sandbox_uids(uid_base):  # what a failed test may have left behind
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _sandbox_uids(uid_base: int) -> dict[int, int]:
    """pid -> real uid of every live process (zombies are not) in the sandbox uid block."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:  # it ended meanwhile
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        uid = int(fields["Uid"].split()[0])
        if uid_base <= uid < uid_base + UID_SPAN and not fields["State"].strip().startswith("Z"):
            found[int(entry.name)] = uid
    return found


def _no_sandbox_left(uid_base: int) -> None:
    """A killed sandbox takes a moment to go (its processes are not serve's to wait for
    when it was adopted): poll with a deadline."""
    wait_until(lambda: not _sandbox_uids(uid_base), timeout=10, what="no sandbox process")


def _env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line)


def test_serve_runs_the_whole_fleet(start) -> None:  # type: ignore[no-untyped-def]
    fleet = start()
    directory = fleet.state_dir
    output = fleet.output()
    assert f"kubectl --kubeconfig {directory}/kubeconfig get sandboxes" in output
    assert f"set -a; . {directory}/e2b.env; set +a" in output
    assert f"envd proxy      {fleet.url('proxy')}" in output

    # The files: modes and contents.
    assert stat.S_IMODE(directory.stat().st_mode) == 0o711
    for name in ("e2b-api-keys", "envd-secret", "sandboxd-token", "e2b.env", "kubeconfig"):
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600, name
    env = _env(directory / "e2b.env")
    assert env["E2B_API_URL"] == fleet.url("e2b")
    assert env["E2B_SANDBOX_URL"] == fleet.url("proxy")
    key = env["E2B_API_KEY"]
    assert re.fullmatch(r"e2b_[0-9a-f]{40}", key)
    assert (directory / "e2b-api-keys").read_text() == f"{key} default\n"
    config = yaml.safe_load((directory / "kubeconfig").read_text())
    assert config["clusters"][0]["cluster"]["server"] == fleet.url("kube")

    with httpx.Client(timeout=10) as http:
        # The agent needs the root token.
        token = (directory / "sandboxd-token").read_text().strip()
        info = http.get(
            f"{fleet.url('sandboxd')}/v1/info", headers={"Authorization": f"Bearer {token}"}
        )
        assert info.status_code == 200
        assert info.json()["advertise_addr"] == f"127.0.0.1:{fleet.ports['sandboxd']}"
        assert http.get(f"{fleet.url('sandboxd')}/v1/info").status_code == 401

        # The Kubernetes-style API.
        groups = http.get(f"{fleet.url('kube')}/apis").json()
        assert "agents.x-k8s.io" in [group["name"] for group in groups["groups"]]

        if _e2b_served():
            assert http.get(f"{fleet.url('e2b')}/health").status_code == 204
            listed = http.get(f"{fleet.url('e2b')}/v2/sandboxes", headers={"X-API-Key": key})
            assert (listed.status_code, listed.json()) == (200, [])
            wrong = http.get(f"{fleet.url('e2b')}/v2/sandboxes", headers={"X-API-Key": "e2b_0"})
            assert wrong.status_code == 401
        else:
            assert "the e2b API is not part of this build yet" in output
            assert http.get(f"{fleet.url('e2b')}/health").status_code == 503

    if _e2b_served() and importlib.util.find_spec("e2b") is not None:
        # The one-liner serve prints, with the SDK configured by e2b.env alone.
        one_liner = subprocess.run(
            [sys.executable, "-c", ONE_LINER],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert one_liner.returncode == 0, one_liner.stderr
        assert one_liner.stdout.startswith("sb-")

    # A second fleet on the same ports fails at once: one line, exit 2.
    second = subprocess.run(
        _command(directory.parent / "second", fleet.ports, fleet.uid_base + 10),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert second.returncode == 2
    [line] = second.stderr.strip().splitlines()
    assert line.startswith("sandboxctl: error: cannot listen on 127.0.0.1:")
    assert "Address already in use" in line
    assert not (directory.parent / "second").exists()


def test_sigterm_destroys_the_sandboxes_and_a_restart_reuses_the_secrets(start) -> None:  # type: ignore[no-untyped-def]
    fleet = start()
    token = (fleet.state_dir / "sandboxd-token").read_text().strip()
    claimed = httpx.post(
        f"{fleet.url('sandboxd')}/v1/claim",
        json={"template": "base", "ttl_seconds": 600},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert claimed.status_code == 200, claimed.text
    # One claimed sandbox and the warm one that replaces it in the pool.
    wait_until(
        lambda: len(set(_sandbox_uids(fleet.uid_base).values())) == 2,
        what="two sandboxes' processes",
    )
    secrets = {
        name: (fleet.state_dir / name).read_text()
        for name in ("e2b-api-keys", "envd-secret", "sandboxd-token", "e2b.env")
    }

    assert fleet.stop() == 0, fleet.output()
    assert "stopped; sandboxes destroyed" in fleet.output()
    _no_sandbox_left(fleet.uid_base)

    again = start()
    assert again.state_dir == fleet.state_dir
    for name, text in secrets.items():
        assert (again.state_dir / name).read_text() == text, name
    assert again.stop() == 0, again.output()
    _no_sandbox_left(fleet.uid_base)


def test_keep_sandboxes_leaves_them_for_the_next_start(start) -> None:  # type: ignore[no-untyped-def]
    fleet = start("--keep-sandboxes")
    kept = set(_sandbox_uids(fleet.uid_base).values())
    assert kept  # the warm sandbox
    assert fleet.stop() == 0, fleet.output()
    assert "stopped; sandboxes left running (--keep-sandboxes)" in fleet.output()
    assert set(_sandbox_uids(fleet.uid_base).values()) == kept

    again = start()  # adopts it, and destroys it on exit
    assert "adopted 1 sandboxes" in again.output()
    assert again.stop() == 0, again.output()
    _no_sandbox_left(fleet.uid_base)

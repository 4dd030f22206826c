"""``sandboxctl serve`` as a real process: the whole one-host fleet, its files, its stop."""

from __future__ import annotations

import os
import re
import shutil
import ssl
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from e2b import Sandbox

from sandboxctl.sandboxd.runtimedir import OWNER_FILE, OWNER_LOCK, RUNTIME_ROOT_ENV
from tests.fleet.fleet import (
    Fleet,
    free_ports,
    sandbox_uids,
    serve_command,
    start_fleet,
    stop_fleets,
)
from tests.proxy.sdk_stack import create_sandbox
from tests.sandboxd.servers import sandboxes_unavailable, wait_until

KUBECTL = Path(__file__).resolve().parents[2] / ".tools" / "bin" / "kubectl"

pytestmark = pytest.mark.skipif(
    sandboxes_unavailable() is not None, reason=str(sandboxes_unavailable())
)

ONE_LINER = "from e2b import Sandbox; s = Sandbox.create(); print(s.sandbox_id); s.kill()"


@pytest.fixture
def start(state_dir: Path, uid_base: int) -> Iterator:  # type: ignore[type-arg]
    """Start ``sandboxctl serve`` on free ports and wait for its ``ready:`` line."""
    started: list[Fleet] = []
    ports = free_ports()

    def run(*extra: str) -> Fleet:
        fleet = start_fleet(state_dir / "fleet", ports, uid_base, *extra)
        started.append(fleet)
        return fleet

    yield run
    stop_fleets(started)


def _no_sandbox_left(uid_base: int) -> None:
    """A killed sandbox takes a moment to go (its processes are not serve's to wait for
    when it was adopted): poll with a deadline."""
    wait_until(lambda: not sandbox_uids(uid_base), timeout=10, what="no sandbox process")


def test_serve_runs_the_whole_fleet(start) -> None:  # type: ignore[no-untyped-def]
    fleet = start()
    directory = fleet.state_dir
    output = fleet.output()
    assert f"kubectl --kubeconfig {directory}/kubeconfig get sandboxes" in output
    assert f"set -a; . {directory}/e2b.env; set +a" in output
    assert f"envd proxy      {fleet.url('proxy')}" in output
    # The Python the README runs the SDK with (.venv/bin/python in a checkout), and the
    # certificate's names as names.
    python = Path(sys.executable)
    shown = python.relative_to(Path.cwd()) if python.is_relative_to(Path.cwd()) else python
    assert f"\n  {shown} -c 'from e2b import Sandbox; s = Sandbox.create(); print(" in output
    assert f"created {directory}/kube-tls.crt for localhost, 127.0.0.1, ::1\n" in output

    # The files: modes and contents. Nothing in the state dir is for sandbox uids.
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for name in (
        "e2b-api-keys", "envd-secret", "sandboxd-token", "kube-tokens", "kube-tls.key",
        "e2b.env", "kubeconfig",
    ):  # fmt: skip
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600, name
    env = fleet.e2b_env
    assert env["E2B_API_URL"] == fleet.url("e2b")
    assert env["E2B_SANDBOX_URL"] == fleet.url("proxy")
    key = env["E2B_API_KEY"]
    assert re.fullmatch(r"e2b_[0-9a-f]{40}", key)
    assert (directory / "e2b-api-keys").read_text() == f"{key} default\n"
    config = yaml.safe_load((directory / "kubeconfig").read_text())
    kube_url = fleet.url("kube").replace("http:", "https:")  # kubectl sends tokens over TLS only
    assert config["clusters"][0]["cluster"]["server"] == kube_url
    kube_token, scope = (directory / "kube-tokens").read_text().split()
    assert (config["users"][0]["user"], scope) == ({"token": kube_token}, "*")
    if KUBECTL.exists():  # the line serve prints, as it is
        got = subprocess.run(
            [str(KUBECTL), "--kubeconfig", str(directory / "kubeconfig"), "get", "sandboxes"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert (got.returncode, got.stderr) == (0, "No resources found in default namespace.\n")

    with httpx.Client(timeout=10) as http:
        # The agent needs the root token.
        token = (directory / "sandboxd-token").read_text().strip()
        info = http.get(
            f"{fleet.url('sandboxd')}/v1/info", headers={"Authorization": f"Bearer {token}"}
        )
        assert info.status_code == 200
        assert info.json()["advertise_addr"] == f"127.0.0.1:{fleet.ports['sandboxd']}"
        assert http.get(f"{fleet.url('sandboxd')}/v1/info").status_code == 401

        # The Kubernetes-style API: HTTPS with the fleet's own certificate, and a token.
        trust = ssl.create_default_context(cafile=str(directory / "kube-tls.crt"))
        with httpx.Client(timeout=10, verify=trust) as kube:
            auth = {"Authorization": f"Bearer {kube_token}"}
            groups = kube.get(f"{kube_url}/apis", headers=auth).json()
            assert "agents.x-k8s.io" in [group["name"] for group in groups["groups"]]
            assert kube.get(f"{kube_url}/apis").status_code == 401

        assert http.get(f"{fleet.url('e2b')}/health").status_code == 204
        listed = http.get(f"{fleet.url('e2b')}/v2/sandboxes", headers={"X-API-Key": key})
        assert (listed.status_code, listed.json()) == (200, [])
        wrong = http.get(f"{fleet.url('e2b')}/v2/sandboxes", headers={"X-API-Key": "e2b_0"})
        assert wrong.status_code == 401

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
        serve_command(directory.parent / "second", fleet.ports, fleet.uid_base + 10),
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
        json={"template": "default", "ttl_seconds": 600},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert claimed.status_code == 200, claimed.text
    # One claimed sandbox and the warm one that replaces it in the pool.
    wait_until(
        lambda: len(set(sandbox_uids(fleet.uid_base).values())) == 2,
        what="two sandboxes' processes",
    )
    secrets = {
        name: (fleet.state_dir / name).read_text()
        for name in (
            "e2b-api-keys",
            "envd-secret",
            "sandboxd-token",
            "kube-tokens",
            "kube-tls.crt",
            "e2b.env",
            "kubeconfig",
        )
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
    kept = set(sandbox_uids(fleet.uid_base).values())
    assert kept  # the warm sandbox
    assert fleet.stop() == 0, fleet.output()
    assert "stopped; sandboxes left running (--keep-sandboxes)" in fleet.output()
    assert set(sandbox_uids(fleet.uid_base).values()) == kept

    again = start()  # adopts it, and destroys it on exit
    assert "adopted 1 sandboxes" in again.output()
    assert again.stop() == 0, again.output()
    _no_sandbox_left(fleet.uid_base)


def _files(directory: Path) -> dict[str, tuple[int, int, str]]:
    """Each path under ``directory`` (but the agent's database dir, which its running
    agent writes): its mode, its change time, and where it points if a symlink."""
    found = {}
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory)
        if relative.parts[0] == "sandboxd":
            continue
        info = path.lstat()
        target = os.readlink(path) if path.is_symlink() else ""
        found[str(relative)] = (info.st_mode, info.st_ctime_ns, target)
    return found


def _refused(command: list[str], **env: str) -> str:
    """The one line of a start that must be refused (exit 2)."""
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=30, env={**os.environ, **env}
    )
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = done.stderr.strip().splitlines()
    return line


def test_a_refused_start_names_its_first_cause_and_changes_nothing(  # type: ignore[no-untyped-def]
    start, state_dir: Path, runtime_root: Path, uid_base: int
) -> None:
    fleet = start()
    # The runtime dir of a checkout since deleted: a start that succeeds collects it.
    gone = runtime_root / "0123456789abcdef"
    gone.mkdir(mode=0o711)
    (gone / OWNER_FILE).write_text(f"{state_dir}/deleted-checkout/.sandboxctl\n")
    (gone / OWNER_LOCK).touch()
    files, runtime_dirs = _files(fleet.state_dir), sorted(runtime_root.iterdir())
    ports = fleet.ports  # every one taken
    other = state_dir / "other"

    # The template first, though every port is taken.
    line = _refused([*serve_command(other, ports, uid_base + 10), "--template", "nosuch"])
    assert line.startswith("sandboxctl: error: --template nosuch: not in the template store")
    # Then the state dir: its serve runs (and holds every port too).
    in_use = f"sandboxctl: error: --state-dir {fleet.state_dir} is in use by another running agent"
    assert _refused(serve_command(fleet.state_dir, ports, uid_base + 10)) == in_use
    # Its agent's own lock tells too, when the runtime dir is elsewhere (another root).
    elsewhere = state_dir / "another-runtime-root"
    command = serve_command(fleet.state_dir, free_ports(), uid_base + 10)
    assert _refused(command, **{RUNTIME_ROOT_ENV: str(elsewhere)}) == in_use

    assert not other.exists()
    assert not elsewhere.exists()
    assert _files(fleet.state_dir) == files
    assert sorted(runtime_root.iterdir()) == runtime_dirs  # the gone one included
    assert fleet.process.poll() is None
    assert fleet.stop() == 0, fleet.output()
    shutil.rmtree(gone)


def test_an_adopting_restart_lists_and_kills_the_commands_of_the_earlier_process(  # type: ignore[no-untyped-def]
    start,
) -> None:
    fleet = start("--keep-sandboxes")
    sandbox = create_sandbox(fleet.sdk, timeout=600)
    handle = sandbox.commands.run("sleep 3000", background=True)
    pid = handle.pid
    handle.disconnect()
    assert fleet.stop() == 0, fleet.output()

    again = start()  # adopts the sandbox, and destroys it on exit
    assert "adopted 2 sandboxes" in again.output()
    adopted = Sandbox.connect(sandbox.sandbox_id, **again.sdk)
    [listed] = [p for p in adopted.commands.list() if p.pid == pid]
    assert (listed.cmd, listed.args) == ("/bin/bash", ["-l", "-c", "sleep 3000"])
    running = adopted.commands.run(f"ps -o args= -p {pid}").stdout
    assert running.strip() == "sleep 3000"
    assert adopted.commands.kill(pid) is True
    wait_until(lambda: pid not in [p.pid for p in adopted.commands.list()], what="the kill to take")
    assert adopted.commands.kill(pid) is False
    assert again.stop() == 0, again.output()
    _no_sandbox_left(fleet.uid_base)


def test_a_stop_with_background_commands_running_is_clean(start) -> None:  # type: ignore[no-untyped-def]
    fleet = start()
    sandbox = create_sandbox(fleet.sdk)
    quiet = sandbox.commands.run("sleep 100", background=True)
    talking = sandbox.commands.run("while :; do echo hi; sleep 0.1; done", background=True)
    fed = sandbox.commands.run("cat", background=True, stdin=True)
    listed = {p.pid for p in sandbox.commands.list()}
    assert {quiet.pid, talking.pid, fed.pid} <= listed
    for handle in (quiet, talking, fed):  # as a script that started them and ended does
        handle.disconnect()

    assert fleet.stop() == 0, fleet.output()
    output = fleet.output()
    assert "stopped; sandboxes destroyed" in output
    for broken in ("Traceback", "Event loop is closed", "that handles pid", "Exception ignored"):
        assert broken not in output, output
    _no_sandbox_left(fleet.uid_base)


def test_a_stop_with_the_sdks_streams_still_open_says_so_in_one_line(start) -> None:  # type: ignore[no-untyped-def]
    """Handles still connected (an interactive session) hold their command streams open
    past the shutdown grace: uvicorn cancels them, which is the grace's purpose, not an
    application error with a traceback."""
    fleet = start()
    sandbox = create_sandbox(fleet.sdk)
    handles = [
        sandbox.commands.run("sleep 100", background=True),
        sandbox.commands.run("while :; do echo hi; sleep 0.1; done", background=True),
    ]
    assert {h.pid for h in handles} <= {p.pid for p in sandbox.commands.list()}

    assert fleet.stop() == 0, fleet.output()
    output = fleet.output()
    assert "stopped; sandboxes destroyed" in output
    assert re.search(r"INFO closed \d+ open request\(s\) at the end of the", output), output
    for broken in ("Traceback", "ERROR", "Exception in ASGI application"):
        assert broken not in output, output
    _no_sandbox_left(fleet.uid_base)

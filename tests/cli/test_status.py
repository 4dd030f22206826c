"""``sandboxctl status`` and ``inventory --source mesh|kube`` against a real one-node
``serve``: one fleet for the whole module (a start costs seconds), read from its state
dir, its agent and its kubeconfig, as an operator would."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxctl.agentapi import AgentClient, ClaimRequest
from tests.cli.conftest import Run
from tests.conftest import process_slot
from tests.fleet.fleet import Fleet, free_ports, start_fleet, stop_fleets
from tests.sandboxd.servers import free_port, sandboxes_unavailable

UID_BASE = 3_500_000 + process_slot() * 20  # clear of the other fleets' blocks
FRAME_TIMEOUT = 30.0

pytestmark = [
    pytest.mark.root,
    pytest.mark.services,
    pytest.mark.skipif(sandboxes_unavailable() is not None, reason=str(sandboxes_unavailable())),
]


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    top = Path(tempfile.mkdtemp(prefix="sandboxctl-status-"))
    running = start_fleet(top / "state", free_ports(), UID_BASE)
    try:
        yield running
    finally:
        stop_fleets([running])
        shutil.rmtree(top, ignore_errors=True)


def agent(fleet: Fleet) -> str:
    return f"127.0.0.1:{fleet.ports['sandboxd']}"


def from_state_dir(fleet: Fleet) -> list[str]:
    """status over the fleet's state dir alone: its agent (on a free port, not serve's
    default) and its metrics listener are what serve wrote there."""
    return ["status", "--state-dir", str(fleet.state_dir)]


@pytest.fixture
def claimed(fleet: Fleet) -> Iterator[str]:
    """One sandbox claimed on the fleet's agent (released at the end)."""
    token = (fleet.state_dir / "sandboxd-token").read_text().strip()
    with AgentClient(agent(fleet), token) as client:
        grant = client.claim(ClaimRequest(template="default", ttl_seconds=300))
        try:
            yield grant.id
        finally:
            client.release(grant.id)


def test_status_shows_the_fleet_serve_runs(run: Run, fleet: Fleet) -> None:
    result = run(*from_state_dir(fleet))

    assert result.code == 0, result.err
    out = result.out
    assert f"fleet: serve's state dir {fleet.state_dir}" in out
    for name in ("e2b API", "envd proxy", "Kubernetes API", "metrics", "sandboxd"):
        line = next(line for line in out.splitlines() if line.startswith(name))
        assert line.split()[-1] == "up", line
    assert f"https://127.0.0.1:{fleet.ports['kube']}" in out
    node = next(line for line in out.splitlines() if agent(fleet) in line and "fresh" in line)
    assert node.split()[-1] == "16"  # its capacity: serve's --max-sandboxes
    assert any(line.split()[:1] == ["default/none/small"] for line in out.splitlines())
    assert any(line.split()[:1] == ["default"] for line in out.splitlines())  # the template


def test_json_gives_every_part_of_the_view(run: Run, fleet: Fleet, claimed: str) -> None:
    result = run(*from_state_dir(fleet), "-o", "json")

    assert result.code == 0, result.err
    document = json.loads(result.out)
    assert document["apiVersion"] == "sandboxctl.dev/v1"
    assert document["kind"] == "FleetStatus"
    assert [(e["name"], e["up"]) for e in document["endpoints"]] == [
        ("e2b API", True),
        ("envd proxy", True),
        ("Kubernetes API", True),
        ("metrics", True),
        ("sandboxd", True),
    ]
    assert document["endpoints"][0]["url"] == fleet.url("e2b")
    assert document["endpoints"][3]["url"].startswith("http://127.0.0.1:")  # a free port
    assert document["endpoints"][4]["url"] == f"http://{agent(fleet)}"
    [node] = document["nodes"]
    assert node["address"] == agent(fleet)
    assert node["state"] == "fresh"
    assert node["sandboxes"] == 1
    assert document["counts"]["fresh"] == 1
    [pool] = document["pools"]
    assert (pool["template"], pool["target"]) == ("default", 1)
    assert document["sandboxes"] == {"total": 1, "byState": {"Running": 1}}
    [template] = document["templates"]
    assert template["template"] == "default"
    assert template["nodes"] == [node["node"]]
    assert template["digest"]
    assert document["unreachable"] == []


def test_a_fleet_that_does_not_answer_is_one_line(run: Run, fleet: Fleet) -> None:
    nobody = f"127.0.0.1:{free_port()}"
    result = run("status", "--state-dir", str(fleet.state_dir), "--sandboxd-seeds", nobody)

    assert result.code == 2
    assert result.out == ""
    [line] = result.err.splitlines()
    assert line.startswith(f"sandboxctl: error: no sandboxd of the fleet in {fleet.state_dir}")
    assert nobody in line
    assert "is serve running?" in line


def test_watch_redraws_until_ctrl_c_and_exits_0(fleet: Fleet) -> None:
    command = [sys.executable, "-m", "sandboxctl", *from_state_dir(fleet)]
    watching = subprocess.Popen(
        [*command, "--watch", "--interval", "100ms", "-o", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a shell's background job has Ctrl-C ignored; this one is a terminal's
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert watching.stdout is not None
        frames = [json.loads(watching.stdout.readline()) for _ in range(2)]
        watching.send_signal(signal.SIGINT)
        rest, err = watching.communicate(timeout=FRAME_TIMEOUT)
    finally:
        watching.kill()
    assert [frame["kind"] for frame in frames] == ["FleetStatus", "FleetStatus"]
    assert frames[0]["now"] <= frames[1]["now"]
    assert all(frame["nodes"][0]["state"] == "fresh" for frame in frames)
    assert watching.returncode == 0, err
    assert "Traceback" not in err
    for line in rest.splitlines():  # any frame drawn before the stop is whole
        assert json.loads(line)["kind"] == "FleetStatus"


def test_inventory_reads_the_agents_themselves(run: Run, fleet: Fleet) -> None:
    token_file = str(fleet.state_dir / "sandboxd-token")
    nobody = f"127.0.0.1:{free_port()}"
    seeds = f"{agent(fleet)},{nobody}"

    result = run("inventory", "--source", "mesh", "--sandboxd-seeds", seeds,
                 "--sandboxd-token-file", token_file, "-o", "json")  # fmt: skip

    assert result.code == 0, result.err
    [node] = json.loads(result.out)["nodes"]
    assert (node["address"], node["state"], node["warm"]) == (agent(fleet), "fresh", 1)
    assert result.err == f"sandboxctl: sandboxd {nobody} did not answer: connection refused\n"


def test_inventory_from_agents_without_their_token_is_one_line(run: Run, fleet: Fleet) -> None:
    result = run("inventory", "--source", "mesh", "--sandboxd-seeds", agent(fleet))

    assert result.code == 2
    assert result.err == (
        f"sandboxctl: error: sandboxd seed {agent(fleet)} refused the token: reading the agents "
        "needs the fleet's root token (--sandboxd-token-file)\n"
    )


@pytest.mark.parametrize("verb", ["inventory", "status"])
def test_serves_kubeconfig_is_named_for_what_it_is(run: Run, fleet: Fleet, verb: str) -> None:
    kubeconfig = fleet.state_dir / "kubeconfig"
    result = run(verb, "--source", "kube", "--kubeconfig", str(kubeconfig))

    assert result.code == 2
    assert result.out == ""
    [line] = result.err.splitlines()
    assert line.startswith(
        f"sandboxctl: error: --kubeconfig {kubeconfig} reaches "
        f"https://127.0.0.1:{fleet.ports['kube']}, a sandboxctl Sandbox API"
    )
    assert "live on a real Kubernetes API" in line
    assert "the server could not find the requested resource" not in line

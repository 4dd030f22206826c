"""``sandboxctl lanes run all --kit local --report F`` as a user runs it: a process that
builds the local kit on the real control plane, runs every lane of the catalog that runs
on it, tears the kit down and exits 0 with every one of them PASS in the report. Without
the control plane's tools the kit falls back to the API double and says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandboxctl.lanes import catalog, k1out
from sandboxctl.lanes.local import DOUBLE_NAME, real_plane_missing, unavailable
from sandboxctl.lanes.model import LOCAL, LaneError, Windows
from sandboxctl_testing.controlplane import Tools

RUN_TIMEOUT = 720  # seconds; the run itself takes about 5 minutes on this machine
TEARDOWN_TIMEOUT = 180  # seconds for the kit to stop every part and remove its network
BUILD_TIMEOUT = 240  # seconds for a run that builds the kit and runs no lane

needs_the_kit = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
needs_the_tools = pytest.mark.skipif(
    bool(Tools.find().missing(("etcd", "kube-apiserver"))),
    reason="the real control plane's tools are not built (make kube-tools)",
)


def _namespaces() -> set[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in listing.stdout.splitlines() if line.strip()}


def _lanes(
    selector: str, report: Path, timeout: float, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str, str]:
    run = subprocess.Popen(
        [sys.executable, "-m", "sandboxctl", "lanes", "run", selector, "--kit", "local",
         "--report", str(report)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        out, err = run.communicate(timeout=timeout)
    finally:
        if run.poll() is None:
            run.terminate()  # the kit tears itself down on SIGTERM
            try:
                run.communicate(timeout=TEARDOWN_TIMEOUT)
            except subprocess.TimeoutExpired:
                run.kill()  # its teardown hung: do not leave it running past the test
                run.communicate()
    ours = f"lanes{run.pid % 100000:05d}"  # local.py names its hosts' namespaces so
    assert not [name for name in _namespaces() if name.startswith(ours)]
    return run, out, err


@needs_the_kit
@needs_the_tools
def test_every_local_lane_passes_on_the_real_control_plane(tmp_path: Path) -> None:
    report = tmp_path / "lanes.json"
    run, out, err = _lanes("all", report, RUN_TIMEOUT)

    assert run.returncode == 0, out + err[-4000:]
    body = json.loads(report.read_text())
    results = {lane["lane"]: lane["result"] for lane in body["lanes"]}
    expected = [lane.id for lane in catalog.lanes() if LOCAL in lane.kits]
    assert k1out.ETCD_LANE.id in expected
    assert list(results) == expected
    assert set(results.values()) == {"PASS"}, out
    assert (tmp_path / "lanes.md").read_text().count("**PASS**") == len(expected)
    for lane in expected:  # the table on stdout: one PASS line per lane
        assert any(line.split()[:2] == ["PASS", lane] for line in out.splitlines())
    assert body["control_plane"].startswith("kube-apiserver v1."), body["control_plane"]
    assert " + etcd 3." in body["control_plane"]
    assert f"on {body['control_plane']} (publish" in out.splitlines()[-1]
    assert "not a real control plane" not in err


@needs_the_kit
def test_without_the_tools_the_kit_runs_on_the_double_and_says_so(tmp_path: Path) -> None:
    """The fallback: one line naming `make kube-tools` before the kit is built, the kit up
    on the double, the report naming it, and K1OUT-02 refused there (no etcd) before it
    claims anything."""
    empty = tmp_path / "no-tools"
    empty.mkdir()
    report = tmp_path / "lanes.json"
    env = {**os.environ, "SANDBOXCTL_KUBE_TOOLS": str(empty)}
    run, out, err = _lanes(k1out.ETCD_LANE.id, report, BUILD_TIMEOUT, env)

    assert run.returncode == 1, out + err[-4000:]
    said = [line for line in err.splitlines() if "not a real control plane" in line]
    assert len(said) == 1, err[-4000:]
    assert said[0].startswith(f"running on {DOUBLE_NAME}")
    assert "`make kube-tools`" in said[0]
    body = json.loads(report.read_text())
    assert body["control_plane"] == DOUBLE_NAME
    (lane,) = body["lanes"]
    assert (lane["lane"], lane["result"], lane["figure"]) == ("K1OUT-02", "FAIL", "not measured")
    assert "which has no etcd" in lane["detail"]
    assert "make kube-tools" in lane["detail"]


def test_the_tools_check_names_the_make_target_or_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = not Tools.find().missing(("etcd", "kube-apiserver"))
    assert (real_plane_missing() is None) == built
    monkeypatch.setenv("SANDBOXCTL_KUBE_TOOLS", str(tmp_path))

    missing = real_plane_missing()

    assert missing is not None
    assert f"kube-apiserver is not in {tmp_path}" in missing
    assert "`make kube-tools`" in missing
    assert "\n" not in missing


class _KitOnTheDouble:
    """As much of a kit as K1OUT-02 touches before it claims: its name and etcd."""

    name = LOCAL
    windows = Windows(publish=3.0, stale_after=9.0)

    def __init__(self, problem: str | None) -> None:
        self.problem = problem
        self.calls: list[str] = []

    def etcd_problem(self) -> str | None:
        return self.problem

    def stop_etcd(self) -> None:
        self.calls.append("stop_etcd")

    def start_etcd(self) -> None:
        self.calls.append("start_etcd")


def test_the_etcd_lane_is_refused_on_a_kit_that_cannot_stop_etcd() -> None:
    kit = _KitOnTheDouble("the local kit runs the double, which has no etcd")
    with pytest.raises(LaneError, match="which has no etcd"):
        k1out.StoreOutage().run(kit, frozenset({k1out.ETCD_LANE.id}), None)  # type: ignore[arg-type]
    assert kit.calls == []
    assert k1out.ETCD_LANE.kits == frozenset({LOCAL})
    assert k1out.ETCD_LANE.group == k1out.LANE.group

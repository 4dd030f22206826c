"""``sandboxctl lanes run all --kit local --report F`` as a user runs it: a process that
builds the local kit, runs every lane of the catalog that runs on it, tears the kit down
and exits 0 with every one of them PASS in the report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sandboxctl.lanes import catalog
from sandboxctl.lanes.local import unavailable
from sandboxctl.lanes.model import LOCAL

RUN_TIMEOUT = 600  # seconds; the run itself takes under 5 minutes on this machine
TEARDOWN_TIMEOUT = 180  # seconds for the kit to stop every part and remove its network

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))


def _namespaces() -> set[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in listing.stdout.splitlines() if line.strip()}


def test_every_local_lane_passes_and_the_kit_is_gone_after(tmp_path: Path) -> None:
    report = tmp_path / "lanes.json"
    run = subprocess.Popen(
        [sys.executable, "-m", "sandboxctl", "lanes", "run", "all", "--kit", "local",
         "--report", str(report)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        out, err = run.communicate(timeout=RUN_TIMEOUT)
    finally:
        if run.poll() is None:
            run.terminate()  # the kit tears itself down on SIGTERM
            try:
                run.communicate(timeout=TEARDOWN_TIMEOUT)
            except subprocess.TimeoutExpired:
                run.kill()  # its teardown hung: do not leave it running past the test
                run.communicate()

    assert run.returncode == 0, out + err[-4000:]
    body = json.loads(report.read_text())
    results = {lane["lane"]: lane["result"] for lane in body["lanes"]}
    expected = [lane.id for lane in catalog.lanes() if LOCAL in lane.kits]
    assert list(results) == expected
    assert set(results.values()) == {"PASS"}, out
    assert (tmp_path / "lanes.md").read_text().count("**PASS**") == len(expected)
    for lane in expected:  # the table on stdout: one PASS line per lane
        assert any(line.split()[:2] == ["PASS", lane] for line in out.splitlines())
    ours = f"lanes{run.pid % 100000:05d}"  # local.py names its hosts' namespaces so
    assert not [name for name in _namespaces() if name.startswith(ours)]

"""The client matrix: each e2b client drives one ``sandboxctl serve`` fleet (a real process)
through the same scenario. The clients come from scripts/get-e2b-clients (run by
``make test``), in a cache outside the checkout; a client that is not there skips its test,
saying why."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import process_slot
from tests.fleet.fleet import Fleet, free_ports, start_fleet, stop_fleets
from tests.sandboxd.servers import sandboxes_unavailable

ROOT = Path(__file__).resolve().parents[3]
UID_BASE = 2_700_000 + process_slot() * 20  # clear of the other fleets' blocks


def client_cache() -> Path:
    """Where scripts/get-e2b-clients puts the clients (the same rule as the script)."""
    if os.environ.get("SANDBOXCTL_CLIENT_CACHE"):
        return Path(os.environ["SANDBOXCTL_CLIENT_CACHE"])
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home) / "sandboxctl" / "e2b-clients"


def node_modules() -> Path:
    modules = client_cache() / "node" / "node_modules"
    if shutil.which("node") is None:
        pytest.skip("no Node.js on this machine")
    if not (modules / "e2b").is_dir() or not (modules / "@e2b" / "cli").is_dir():
        pytest.skip(f"no e2b JS SDK and CLI in {modules.parent}: run scripts/get-e2b-clients")
    return modules


@pytest.fixture(scope="session")
def fleet() -> Iterator[Fleet]:
    reason = sandboxes_unavailable()
    if reason:
        pytest.skip(reason)
    state = Path(tempfile.mkdtemp(prefix="sandboxctl-clients-", dir="/tmp"))
    state.chmod(0o711)
    started = start_fleet(state / "fleet", free_ports(), UID_BASE)
    try:
        yield started
    finally:
        stop_fleets([started])
        shutil.rmtree(state, ignore_errors=True)


def run_client(argv: list[str], fleet: Fleet, **env: str) -> subprocess.CompletedProcess[str]:
    """A client process configured by the fleet's e2b.env alone (plus ``env``)."""
    environment = {**os.environ, **fleet.e2b_env, **env}
    environment.pop("E2B_DEBUG", None)
    return subprocess.run(
        argv, env=environment, capture_output=True, text=True, timeout=180, check=False
    )

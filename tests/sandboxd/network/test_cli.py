"""The e2b CLI's ``sandbox create --detach`` (which always asks for internet access) on a
``sandboxctl serve`` started with no flags: its default pool serves it.

The pinned ``@e2b/cli`` is installed with npm into a cache outside the checkout
(``SANDBOXCTL_NPM_CACHE``, default /var/cache/sandboxctl-tests/npm) the first time;
skipped without Node.js and npm."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import process_slot
from tests.fleet.fleet import free_ports, start_fleet, stop_fleets

CLI_VERSION = "2.19.0"
CACHE = Path(os.environ.get("SANDBOXCTL_NPM_CACHE", "/var/cache/sandboxctl-tests/npm"))
UID_BASE = 2_900_000 + process_slot() * 20


@pytest.fixture(scope="module")
def e2b_cli() -> Path:
    prefix = CACHE / f"e2b-cli-{CLI_VERSION}"
    binary = prefix / "node_modules" / ".bin" / "e2b"
    if not binary.exists():
        if shutil.which("npm") is None or shutil.which("node") is None:
            pytest.skip("Node.js and npm are needed for the e2b CLI")
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
             f"@e2b/cli@{CLI_VERSION}"],
            check=True, capture_output=True, timeout=600,
        )  # fmt: skip
    return binary


@pytest.fixture
def default_serve(state_dir: Path) -> Iterator[dict[str, str]]:
    fleet = start_fleet(state_dir / "fleet", free_ports(), UID_BASE)  # no --pool: base=2
    try:
        yield fleet.e2b_env
    finally:
        stop_fleets([fleet])


def test_the_cli_creates_a_sandbox_on_a_default_serve(
    e2b_cli: Path, default_serve: dict[str, str], state_dir: Path
) -> None:
    home = state_dir / "cli-home"  # the CLI keeps its config in ~/.e2b
    home.mkdir()
    env = {**os.environ, **default_serve, "HOME": str(home), "CI": "1"}
    created = subprocess.run(
        [str(e2b_cli), "sandbox", "create", "--detach"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert created.returncode == 0, created.stdout + created.stderr
    listed = httpx.get(
        f"{default_serve['E2B_API_URL']}/v2/sandboxes",
        headers={"X-API-Key": default_serve["E2B_API_KEY"]},
    ).json()
    assert len(listed) == 1
    assert listed[0]["sandboxID"] in created.stdout + created.stderr

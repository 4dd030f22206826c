"""``sandboxctl serve`` with templates, a real process driven by the unmodified e2b SDK:
its first start makes the default template, no sandbox sees the host's files, a named
template is ``Sandbox.create("NAME")``'s, and the e2b API lists the builds."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import CommandExitException, Sandbox

from sandboxctl.core.templates import build_id
from sandboxctl.core.timestamps import format_rfc3339
from sandboxctl.sandboxd.templates.store import TemplateStore
from tests.conftest import process_slot
from tests.fleet.fleet import Fleet, free_ports, serve_command, start_fleet, stop_fleets
from tests.proxy.sdk_stack import create_sandbox
from tests.sandboxd.servers import sandboxes_unavailable
from tests.sandboxd.templates.cache import seed

pytestmark = pytest.mark.skipif(
    sandboxes_unavailable() is not None, reason=str(sandboxes_unavailable())
)

UID_BASE = 2_500_000 + process_slot() * 20  # clear of the other fleets' blocks
HTTP = "python3 -m http.server --bind 127.0.0.1 8000"
FETCH = (
    "python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:8000\").status)'"
)


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[Fleet, Path]]:
    """A fleet on a store of its own that has the default template's build under another
    name only: its first start names it ``default`` (a build found in the store takes no
    time); and a template ``web`` with start and ready commands."""
    state = Path(tempfile.mkdtemp(prefix="sandboxctl-serve-templates-", dir="/tmp"))
    state.chmod(0o711)
    store = state / "store"
    seed(store, "web", start_cmd=HTTP, ready_cmd=FETCH)
    started = start_fleet(state / "fleet", free_ports(), UID_BASE, "--template-store", str(store))
    try:
        yield started, store
    finally:
        stop_fleets([started])
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def sdk(fleet: tuple[Fleet, Path]) -> dict[str, Any]:
    env = fleet[0].e2b_env
    return {
        "api_key": env["E2B_API_KEY"],
        "api_url": env["E2B_API_URL"],
        "sandbox_url": env["E2B_SANDBOX_URL"],
    }


def test_the_first_start_makes_the_default_template_and_says_so(fleet: tuple[Fleet, Path]) -> None:
    started, store = fleet
    output = started.output()
    assert f"template default is not in {store} yet: building it from Debian packages" in output
    assert "INFO template default: built in " in output
    assert "  template        default: Debian bookworm (ca-certificates, procps), " in output
    assert TemplateStore(store).get("default") is not None


def test_no_sandbox_sees_the_host_files(sdk: dict[str, Any]) -> None:
    sandbox = create_sandbox(sdk)
    try:
        assert sandbox.get_info().template_id == "default"
        with pytest.raises(CommandExitException) as looked:
            sandbox.commands.run("ls /work/main")
        assert "No such file or directory" in looked.value.stderr
        assert "Debian GNU/Linux 12" in sandbox.files.read("/etc/os-release")
        assert [entry.name for entry in sandbox.files.list("/home")] == ["user"]
    finally:
        sandbox.kill()


def test_a_named_template_with_start_and_ready_commands(sdk: dict[str, Any]) -> None:
    sandbox = Sandbox.create("web", **sdk)  # cold: no pool, ready before it is answered
    try:
        assert sandbox.get_info().template_id == "web"
        assert sandbox.commands.run(FETCH).stdout == "200\n"
    finally:
        sandbox.kill()


def test_the_e2b_api_lists_the_builds(fleet: tuple[Fleet, Path]) -> None:
    started, store = fleet
    headers = {"X-API-Key": started.e2b_env["E2B_API_KEY"]}
    api = started.e2b_env["E2B_API_URL"]
    built = TemplateStore(store).get("web")
    assert built is not None
    listed = {t["templateID"]: t for t in httpx.get(f"{api}/templates", headers=headers).json()}
    assert sorted(listed) == ["default", "web"]  # no host root
    assert listed["default"]["aliases"] == ["base", "code-interpreter-v1"]
    web = listed["web"]
    assert web["buildID"] == build_id(built.build.digest)
    assert web["sandboxctl"]["sizeBytes"] == built.build.size_bytes
    assert web["sandboxctl"]["startCmd"] == HTTP
    assert web["sandboxctl"]["readyCmd"] == FETCH
    assert web["createdAt"] == format_rfc3339(datetime.fromtimestamp(built.build.created_at, UTC))
    one = httpx.get(f"{api}/templates/web", headers=headers).json()
    assert one["builds"][0]["buildID"] == web["buildID"]
    alias = httpx.get(f"{api}/templates/aliases/base", headers=headers).json()
    assert alias == {"templateID": "default", "public": True}


def test_a_pool_of_the_host_root_needs_template_base(state_dir: Path, uid_base: int) -> None:
    command = serve_command(state_dir / "fleet", free_ports(), uid_base, pool="base=1")
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "sandboxctl: error: --pool base: template 'base' (the host's root filesystem) is "
        "served only with --template base; this fleet's sandboxes run template 'default': "
        "--pool default=N"
    )
    assert not (state_dir / "fleet").exists()


def test_template_base_keeps_the_host_root(state_dir: Path, uid_base: int) -> None:
    started = start_fleet(
        state_dir / "fleet", free_ports(), uid_base, "--template", "base", pool="base=1"
    )
    try:
        env = started.e2b_env
        sdk = {
            "api_key": env["E2B_API_KEY"],
            "api_url": env["E2B_API_URL"],
            "sandbox_url": env["E2B_SANDBOX_URL"],
        }
        sandbox = create_sandbox(sdk)
        try:
            assert sandbox.get_info().template_id == "base"
            assert sandbox.commands.run("ls -d /work/main").stdout == "/work/main\n"
        finally:
            sandbox.kill()
        assert "sandboxes run on the host's root filesystem, read-only" in started.output()
    finally:
        stop_fleets([started])

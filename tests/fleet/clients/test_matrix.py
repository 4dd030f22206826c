"""The client matrix: the Python SDK (pinned 2.63.0, and the newest 2.x), the JS SDK and the
e2b CLI each run one scenario against ``sandboxctl serve``: create, run, files, watch, pty,
list with metadata, metrics, logs, template list, kill (the CLI: what it has verbs for)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fleet.clients.conftest import client_cache, node_modules, run_client
from tests.fleet.fleet import Fleet

HERE = Path(__file__).resolve().parent
PINNED_SDK = "2.63.0"


def scenario(completed: Any) -> dict[str, Any]:
    assert completed.returncode == 0, completed.stderr[-3000:]
    seen: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return seen


def check_sdk_scenario(seen: dict[str, Any], tag: str) -> None:
    assert seen["run"] == "hi from /bin/bash\n"
    assert seen["files"] == "written"
    assert seen["pty"] is True
    assert seen["list"] == [[True, {"matrix": tag}]]
    assert seen["metrics"] == {"cpu_count": 1, "mem_total": 512 << 20}
    assert seen["logs"] == ["sandbox created", "sandbox claimed"]
    assert "default" in seen["templates"]  # serve's template, built from Debian packages
    assert seen["kill"] is True
    assert seen["running_after_kill"] == []


def newest_python() -> str:
    python = client_cache() / "python-newest" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no newest-2.x SDK at {python.parent.parent}: run scripts/get-e2b-clients")
    return str(python)


@pytest.mark.parametrize("which", ["pinned", "newest"])
def test_python_sdk(fleet: Fleet, which: str) -> None:
    python = sys.executable if which == "pinned" else newest_python()
    tag = f"python-{which}"
    seen = scenario(run_client([python, str(HERE / "scenario_python.py"), tag], fleet))
    if which == "pinned":
        assert seen["version"] == PINNED_SDK
    assert seen["missing_file"] == "FileNotFoundException"
    assert seen["root"] == "InvalidArgumentException"
    assert seen["watch"][0] == ["b.txt", "CREATE"]
    check_sdk_scenario(seen, tag)


def test_js_sdk(fleet: Fleet) -> None:
    modules = node_modules()
    completed = run_client(
        ["node", str(HERE / "scenario_js.cjs"), "js"], fleet, NODE_PATH=str(modules)
    )
    seen = scenario(completed)
    assert seen["version"] == "2.51.0"
    assert seen["watch"][0] == "b.txt:create"
    # envd's stream errors reach the JS SDK as its typed errors (HTTP 200, end of stream)
    assert seen["errors"] == {
        "watchMissing": "FileNotFoundError",
        "runAsRoot": "InvalidArgumentError",
        "connectUnknown": "NotFoundError",
    }
    check_sdk_scenario(seen, "js")


def test_cli(fleet: Fleet) -> None:
    cli = str(node_modules() / ".bin" / "e2b")

    def e2b(*args: str) -> str:
        completed = run_client([cli, *args], fleet)
        assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
        return completed.stdout

    sandbox_id = e2b("sandbox", "create", "--detach", "--timeout", "120").strip().splitlines()[-1]
    # one with metadata, made through the API: the CLI's create takes none
    api = fleet.e2b_env["E2B_API_URL"]
    headers = {"X-API-Key": fleet.e2b_env["E2B_API_KEY"]}
    tagged = httpx.post(
        f"{api}/v2/sandboxes",
        json={"templateID": "base", "metadata": {"matrix": "cli"}},
        headers=headers,
    ).json()["sandboxID"]
    try:
        assert e2b("sandbox", "exec", sandbox_id, "echo", "hi").strip() == "hi"
        listed = json.loads(e2b("sandbox", "list", "-m", "matrix=cli", "-f", "json"))
        assert [(s["sandboxId"], s["metadata"]) for s in listed] == [(tagged, {"matrix": "cli"})]
        printed = e2b("sandbox", "metrics", sandbox_id, "--format", "json").splitlines()
        metrics = [json.loads(line) for line in printed if line.startswith("{")]
        assert metrics[-1]["memTotal"] == 512 << 20
        assert metrics[-1]["cpuCount"] == 1
        logs = e2b("sandbox", "logs", sandbox_id, "--format", "json").splitlines()
        messages = [json.loads(line)["message"] for line in logs if line.startswith("{")]
        assert messages[:2] == ["sandbox created", "sandbox claimed"]
        assert any(m.endswith("exited with code 0 (exit status 0)") for m in messages)
        templates = json.loads(e2b("template", "list", "-f", "json"))
        [default] = [t for t in templates if t["templateID"] == "default"]
        assert "base" in default["aliases"]  # Sandbox.create()'s template is serve's default
    finally:
        assert sandbox_id in e2b("sandbox", "kill", sandbox_id)
        httpx.delete(f"{api}/sandboxes/{tagged}", headers=headers)
    assert json.loads(e2b("sandbox", "list", "-m", "matrix=cli", "-f", "json")) == []

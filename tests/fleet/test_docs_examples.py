"""The README's and the docs' examples, run as written against a default ``serve``.

A block fenced as ```` ```sh serve ```` (a script) or ```` ```console serve ```` (its ``$ ``
lines are the commands; what follows them is output, not compared: ids differ) is an
example a user runs beside ``make serve`` from the checkout. Each runs here with bash in
a directory laid out like a checkout (``.venv`` the one under test, ``.sandboxctl``
serve's state, ``docs`` the repository's, ``sandboxctl`` and the pinned ``kubectl`` on
PATH), against one ``serve`` with its defaults but for the ports: a default port an
example names is replaced by the one this fleet was given.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import process_slot
from tests.fleet.fleet import Fleet, free_ports, start_fleet, stop_fleets
from tests.sandboxd.servers import sandboxes_unavailable

REPOSITORY = Path(__file__).resolve().parents[2]
TOOLS = REPOSITORY / ".tools" / "bin"
DOCUMENTS = [REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").glob("*.md"))]
DEFAULT_PORTS = {"e2b": 3000, "proxy": 3001, "kube": 3002, "sandboxd": 7777}
UID_BASE = 3_100_000 + process_slot() * 20  # clear of the other fleets' blocks
FENCE = re.compile(r"^```(sh|console) serve\n(.*?)^```$", re.MULTILINE | re.DOTALL)
EXAMPLE_TIMEOUT = 120.0

pytestmark = [
    pytest.mark.skipif(sandboxes_unavailable() is not None, reason=str(sandboxes_unavailable())),
    pytest.mark.skipif(not (TOOLS / "kubectl").exists(), reason="needs .tools/bin/kubectl"),
]


def examples() -> list[pytest.ParameterSet]:
    found = []
    for document in DOCUMENTS:
        text = document.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            name = f"{document.relative_to(REPOSITORY)}:{line}"
            kind, body = match.groups()
            script = body if kind == "sh" else commands(body)
            found.append(pytest.param(script, id=name))
    return found


def commands(console: str) -> str:
    """The commands of a console transcript: its ``$ `` lines, with their continuations."""
    out: list[str] = []
    continued = False
    for line in console.splitlines():
        if continued or line.startswith("$ "):
            out.append(line if continued else line[2:])
            continued = line.endswith("\\")
    return "\n".join(out) + "\n"


def with_ports(script: str, ports: dict[str, int]) -> str:
    for name, default in DEFAULT_PORTS.items():
        script = re.sub(rf"\b(127\.0\.0\.1|localhost):{default}\b", rf"\1:{ports[name]}", script)
    return script


@pytest.fixture(scope="module")
def checkout() -> Iterator[tuple[Path, Fleet]]:
    """A directory laid out like a checkout, and the default ``serve`` running in it."""
    top = Path(tempfile.mkdtemp(prefix="sandboxctl-docs-"))
    (top / ".venv").symlink_to(Path(sys.prefix))
    (top / "docs").symlink_to(REPOSITORY / "docs")  # the examples' sample files
    fleet = start_fleet(Path(".sandboxctl"), free_ports(), UID_BASE, cwd=top)
    try:
        yield top, fleet
    finally:
        stop_fleets([fleet])
        shutil.rmtree(top, ignore_errors=True)


def test_the_readme_and_the_serve_guide_have_examples() -> None:
    """The collection below finds what it should (an empty one would pass unseen)."""
    names = {str(param.id).split(":")[0] for param in examples()}
    assert {"README.md", "docs/serve.md"} <= names


@pytest.mark.parametrize("script", examples())
def test_an_example_runs_as_written(checkout: tuple[Path, Fleet], script: str) -> None:
    top, fleet = checkout
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("E2B_", "KUBECONFIG", "PYTHON"))
    }
    # The venv as activated (the docs' bare ``sandboxctl``) and the pinned kubectl.
    env["PATH"] = f"{top / '.venv' / 'bin'}:{TOOLS}:{env.get('PATH', '/usr/bin:/bin')}"
    run = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", with_ports(script, fleet.ports)],
        cwd=top,
        env=env,
        capture_output=True,
        text=True,
        timeout=EXAMPLE_TIMEOUT,
    )
    assert run.returncode == 0, (
        f"exit {run.returncode}\n--- stdout\n{run.stdout}\n--- stderr\n{run.stderr}"
        f"\n--- serve\n{fleet.output()[-3000:]}"
    )

"""The Sandbox API and the e2b API on one default ``serve`` (template ``default``), driven by
the pinned kubectl and the unmodified e2b SDK: one reading of a template name, one id.

The docs' ``web.yaml`` (docs/api.md, ``image: base``) is applied exactly as the docs print
it; a sandbox ``Sandbox.create()`` made is found by ``kubectl get sandbox <sandbox_id>``
and shown with its id in ``kubectl get sandboxes``; ``kubectl explain`` describes the
fields. Skipped without root, bubblewrap or the pinned kubectl.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import process_slot
from tests.fleet.fleet import Fleet, free_ports, start_fleet, stop_fleets
from tests.sandboxd.servers import sandboxes_unavailable, wait_until

REPOSITORY = Path(__file__).resolve().parents[2]
KUBECTL = REPOSITORY / ".tools" / "bin" / "kubectl"
API_DOC = REPOSITORY / "docs" / "api.md"
UID_BASE = 3_300_000 + process_slot() * 20  # clear of the other fleets' blocks

pytestmark = [
    pytest.mark.skipif(sandboxes_unavailable() is not None, reason=str(sandboxes_unavailable())),
    pytest.mark.skipif(not KUBECTL.exists(), reason="needs the pinned kubectl (make kubectl)"),
]


@dataclass
class Served:
    fleet: Fleet
    home: Path

    def kubectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [str(KUBECTL), "--kubeconfig", str(self.fleet.state_dir / "kubeconfig")]
        command += ["--cache-dir", str(self.home / "cache"), *args]
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.home)}
        return subprocess.run(
            command, capture_output=True, text=True, timeout=60, env=env, cwd=self.home
        )

    def python(self, code: str) -> str:
        """``code`` run by the unmodified e2b SDK, configured by serve's e2b.env alone."""
        env = {**os.environ, **self.fleet.e2b_env}
        run = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 0, run.stderr
        return run.stdout.strip()


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    """A default ``serve`` (its template ``default``, one warm sandbox), started once."""
    home = Path(tempfile.mkdtemp(prefix="sandboxctl-kube-e2b-", dir="/tmp"))
    home.chmod(0o711)
    fleet = start_fleet(home / "state", free_ports(), UID_BASE)
    try:
        yield Served(fleet, home)
    finally:
        stop_fleets([fleet])
        subprocess.run(["rm", "-rf", str(home)], check=False)


def docs_web_yaml() -> str:
    """The ``web.yaml`` docs/api.md prints after ``$ cat web.yaml``, as it prints it."""
    text = API_DOC.read_text()
    found = re.search(r"^\$ cat web\.yaml\n(.*?)^\$ ", text, re.MULTILINE | re.DOTALL)
    assert found is not None, "docs/api.md no longer shows web.yaml"
    return found.group(1)


def test_the_docs_web_yaml_claims_on_a_default_serve(served: Served) -> None:
    manifest = docs_web_yaml()
    assert "image: base" in manifest  # the alias Sandbox.create() claims by, too
    (served.home / "web.yaml").write_text(manifest)
    created = served.kubectl("create", "-f", "web.yaml")
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip() == "sandbox.agents.x-k8s.io/web created"
    got = served.kubectl("get", "sandbox", "web", "-o", "yaml")
    assert got.returncode == 0, got.stderr
    obj = yaml.safe_load(got.stdout)
    assert obj["metadata"]["labels"]["sandbox.cocoonstack.io/template"] == "default"
    gone = served.kubectl("delete", "sandbox", "web")
    assert gone.returncode == 0, gone.stderr


def test_a_refused_create_names_its_object(served: Served) -> None:
    manifest = yaml.safe_load(docs_web_yaml())
    manifest["spec"]["podTemplate"]["spec"]["containers"][0]["image"] = "nosuch"
    (served.home / "bad.yaml").write_text(yaml.safe_dump(manifest))
    refused = served.kubectl("create", "-f", "bad.yaml")
    assert refused.returncode == 1
    assert 'The sandboxes "web" is invalid' in refused.stderr, refused.stderr
    assert 'Not found: "nosuch"' in refused.stderr

    del manifest["metadata"]["name"]
    manifest["metadata"]["generateName"] = "web-"
    (served.home / "bad.yaml").write_text(yaml.safe_dump(manifest))
    refused = served.kubectl("create", "-f", "bad.yaml")
    assert refused.returncode == 1
    assert 'The sandboxes "generateName web-" is invalid' in refused.stderr, refused.stderr


def test_kubectl_finds_and_shows_a_sandbox_by_the_sdks_id(served: Served) -> None:
    sandbox_id = served.python(
        "from e2b import Sandbox; print(Sandbox.create(timeout=600).sandbox_id)"
    )
    assert sandbox_id.startswith("sb-")
    try:
        got = served.kubectl("get", "sandbox", sandbox_id, "-o", "yaml")
        assert got.returncode == 0, got.stderr
        obj = yaml.safe_load(got.stdout)
        assert obj["metadata"]["annotations"]["sandbox.cocoonstack.io/claim-id"] == sandbox_id
        name = obj["metadata"]["name"]

        listed = served.kubectl("get", "sandboxes")
        assert listed.returncode == 0, listed.stderr
        header, *rows = listed.stdout.splitlines()
        assert header.split() == ["NAME", "ID", "NODE", "PHASE", "TEMPLATE", "AGE"]
        [row] = [row.split() for row in rows if row.split()[0] == name]
        assert row[1:5] == [sandbox_id, socket.gethostname(), "Running", "default"]

        wide = served.kubectl("get", "sandbox", sandbox_id, "-o", "wide")
        assert wide.returncode == 0, wide.stderr
        header, row_text = wide.stdout.splitlines()
        assert header.split()[6:] == ["EXPIRES", "IN", "IP", "CPUS", "MEMORY"]
        cells = row_text.split()
        assert cells[:2] == [name, sandbox_id]
        assert re.fullmatch(r"\d+m(\d+s)?", cells[6]), cells  # about 10 minutes left
        assert re.fullmatch(r"\d+(Mi|Gi)", cells[-1]), cells
    finally:
        deleted = served.kubectl("delete", "sandbox", sandbox_id)
    assert deleted.returncode == 0, deleted.stderr

    def released() -> bool:
        return served.kubectl("get", "sandbox", sandbox_id).returncode == 1

    wait_until(released, what="the sandbox gone from kubectl get")


def test_kubectl_explain_describes_the_sandbox_and_its_spec(served: Served) -> None:
    kind = served.kubectl("explain", "sandboxes")
    assert kind.returncode == 0, kind.stderr
    assert "KIND:       Sandbox" in kind.stdout
    assert "A sandbox claimed on one node of the fleet" in kind.stdout
    for field in ("apiVersion", "kind", "metadata", "spec", "status"):
        assert re.search(rf"^  {field}\s+<", kind.stdout, re.MULTILINE), (field, kind.stdout)

    spec = served.kubectl("explain", "sandbox.spec")
    assert spec.returncode == 0, spec.stderr
    assert "FIELD: spec <Object>" in spec.stdout
    assert "podTemplate\t<Object>" in spec.stdout
    assert "shutdownTime\t<string>" in spec.stdout

    image = served.kubectl("explain", "sandbox.spec.podTemplate.spec.containers.image")
    assert image.returncode == 0, image.stderr
    assert "alias" in image.stdout, image.stdout

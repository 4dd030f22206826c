"""The pinned kubectl (1.35.2, ``make kubectl``) against the API server over two real agents.

Two in-process host agents (bubblewrap sandboxes, a root token) are read by the mesh
inventory source; the API server serves the store built on it, and kubectl talks to it
through a kubeconfig. Skipped without the pinned kubectl, root or bubblewrap.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from sandboxctl.apiserver import create_kube_app, write_kubeconfig
from sandboxctl.core.ids import public_id
from sandboxctl.core.model import PoolKey
from sandboxctl.sandboxd.agent import Agent
from sandboxctl.store import Query, SandboxStore
from tests.apiserver.conftest import AGENT_NODES
from tests.apiserver.helpers import (
    AUTH,
    KUBE_TOKEN,
    KUBE_TOKENS,
    Lines,
    kube_tls,
    serving,
    trusting,
)
from tests.sandboxd.servers import sandboxes_unavailable, wait_until
from tests.store.real_fleet import RealFleet

KUBECTL = Path(__file__).resolve().parents[2] / ".tools" / "bin" / "kubectl"
BASE = PoolKey("base")
NODES = AGENT_NODES


def _skip_reason() -> str | None:
    if not KUBECTL.exists():
        return "needs the pinned kubectl in .tools/bin (make kubectl)"
    return sandboxes_unavailable()


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


@dataclass
class Fleet:
    store: SandboxStore
    agents: dict[str, Agent]
    url: str
    kubeconfig: Path
    home: Path

    def command(self, *args: str) -> list[str]:
        cache = str(self.home / "cache")
        return [str(KUBECTL), "--kubeconfig", str(self.kubeconfig), "--cache-dir", cache, *args]

    def env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", ""), "HOME": str(self.home)}

    def kubectl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(*args), capture_output=True, text=True, timeout=timeout, env=self.env()
        )

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.command(*args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env(),
        )

    def claim(self, name: str) -> str:
        """Claim through the store, then wait until the mesh inventory shows it."""
        granted = self.store.claim("default", name, BASE, ttl_seconds=300)
        wait_until(lambda: self.listed(name), what=f"{name} in the inventory")
        return granted.node

    def release(self, name: str) -> None:
        located = self.store.locate("default", name)
        assert located is not None
        self.store.release(located)

    def listed(self, name: str) -> bool:
        return any(
            agent.sandboxes(claim_ref=f"default/{name}") for agent in self.agents.values()
        ) and any(
            obj["metadata"]["name"] == name for obj in self.store.list(Query.parse("default")).items
        )


@pytest.fixture
def fleet(agents: RealFleet, tmp_path: Path) -> Iterator[Fleet]:
    with ExitStack() as stack:
        fleet = agents  # shared with test_reads, as fresh as a fleet of this test's own
        app = create_kube_app(fleet.store, KUBE_TOKENS, watch_interval=0.2)
        url = stack.enter_context(serving(app, tls=kube_tls()))
        ca = kube_tls().cert_file.read_bytes()
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url, KUBE_TOKEN, ca)
        yield Fleet(fleet.store, fleet.agents, url, kubeconfig, tmp_path)


def test_kubectl_discovers_the_sandbox_resource(fleet: Fleet) -> None:
    version = fleet.kubectl("version")
    assert version.returncode == 0, version.stderr
    assert "Server Version: v1.35.0" in version.stdout
    assert "WARNING" not in version.stderr  # no version skew
    resources = fleet.kubectl("api-resources")
    assert resources.returncode == 0, resources.stderr
    [row] = resources.stdout.splitlines()[1:]
    assert row.split() == ["sandboxes", "sbx", "agents.x-k8s.io/v1beta1", "true", "Sandbox"]


def test_kubectl_gets_sandboxes_as_a_table_and_as_yaml(fleet: Fleet) -> None:
    empty = fleet.kubectl("get", "sandboxes")
    assert empty.returncode == 0, empty.stderr
    assert "No resources found in default namespace." in empty.stderr

    node = fleet.claim("k1")
    table = fleet.kubectl("get", "sandboxes")
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    assert header.split() == ["NAME", "ID", "NODE", "PHASE", "TEMPLATE", "AGE"]
    cells = row.split()
    assert cells[0] == "k1"
    assert cells[1].startswith("sb-")  # the id as the SDK spells it
    assert cells[2:5] == [node, "Running", "base"]

    short = fleet.kubectl("get", "sbx", "k1", "-o", "yaml")
    assert short.returncode == 0, short.stderr
    obj = yaml.safe_load(short.stdout)
    assert (obj["kind"], obj["metadata"]["name"]) == ("Sandbox", "k1")
    assert obj["status"]["nodeName"] == node
    assert obj["metadata"]["annotations"]["sandbox.cocoonstack.io/claim-id"].startswith("sb-")

    listed = fleet.kubectl("get", "sandboxes", "-o", "yaml")
    assert listed.returncode == 0, listed.stderr
    items = yaml.safe_load(listed.stdout)["items"]
    assert [(i["kind"], i["metadata"]["name"]) for i in items] == [("Sandbox", "k1")]

    everywhere = fleet.kubectl("get", "sandboxes", "-A", "--show-labels")
    assert everywhere.returncode == 0, everywhere.stderr
    assert everywhere.stdout.splitlines()[1].split()[:2] == ["default", "k1"]
    assert f"sandbox.cocoonstack.io/node={node}" in everywhere.stdout


def test_kubectl_get_watch_sees_a_create_and_a_delete(fleet: Fleet) -> None:
    with fleet.start("get", "sandboxes", "--watch", "--output-watch-events") as process:
        lines = Lines(iter(process.stdout.readline, ""), process.kill)  # type: ignore[union-attr]
        try:
            node = fleet.claim("w1")
            added = lines.until(lambda line: "w1" in line and "ADDED" in line, what="w1 ADDED")
            assert added.split()[:5] == ["ADDED", "w1", added.split()[2], node, "Running"]
            fleet.release("w1")
            lines.until(lambda line: line.split()[:2] == ["DELETED", "w1"], what="w1 DELETED")
            header = lines.seen[0].split()
            assert header == ["EVENT", "NAME", "ID", "NODE", "PHASE", "TEMPLATE", "AGE"]
        finally:
            lines.close()


def test_kubectl_wait_for_delete_returns_when_the_sandbox_is_gone(fleet: Fleet) -> None:
    fleet.claim("x1")
    with fleet.start("wait", "--for=delete", "sandbox/x1", "--timeout=60s", "-v=6") as process:
        log = Lines(iter(process.stderr.readline, ""), process.kill)  # type: ignore[union-attr]
        log.until(lambda line: "sendInitialEvents=true" in line, what="the WatchList request")
        fleet.release("x1")
        try:
            assert process.wait(timeout=30) == 0, log.seen
        finally:
            log.close()
        out = process.stdout.read()  # type: ignore[union-attr]
    assert out.strip() == "sandbox.agents.x-k8s.io/x1 condition met"

    absent = fleet.kubectl("wait", "--for=delete", "sandbox/never", "--timeout=10s")
    assert absent.returncode == 0, absent.stderr


def test_kubectl_delete_releases_the_claim(fleet: Fleet) -> None:
    fleet.claim("d1")
    deleted = fleet.kubectl("delete", "sandbox", "d1")
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.strip() == 'sandbox.agents.x-k8s.io "d1" deleted from default namespace'
    assert not any(agent.sandboxes(claim_ref="default/d1") for agent in fleet.agents.values())
    assert fleet.store.locate("default", "d1") is None

    again = fleet.kubectl("delete", "sandbox", "d1")
    assert again.returncode == 1
    assert 'sandboxes.agents.x-k8s.io "d1" not found' in again.stderr


def test_kubectl_names_an_unsupported_field_selector(fleet: Fleet) -> None:
    result = fleet.kubectl("get", "sandboxes", "--field-selector", "spec.x=y")
    assert result.returncode != 0
    assert 'field selector "spec.x" is not supported on sandboxes' in result.stderr
    assert "BadRequest" in result.stderr


def test_kubectl_create_claims_a_sandbox(fleet: Fleet) -> None:
    manifest = fleet.home / "sandbox.yaml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "agents.x-k8s.io/v1beta1",
                "kind": "Sandbox",
                "metadata": {
                    "name": "c1",
                    "annotations": {"sandbox.cocoonstack.io/ttl-seconds": "120"},
                },
                "spec": {"podTemplate": {"spec": {"containers": [{"name": "m", "image": "base"}]}}},
            }
        )
    )
    created = fleet.kubectl("create", "-f", str(manifest), "-o", "yaml")  # validates: openapi v3
    assert created.returncode == 0, created.stderr
    obj = yaml.safe_load(created.stdout)
    assert obj["metadata"]["resourceVersion"].isdigit()
    assert obj["status"]["nodeName"] in NODES
    claim_id = obj["metadata"]["annotations"]["sandbox.cocoonstack.io/claim-id"]
    owner = fleet.agents[obj["status"]["nodeName"]]
    [record] = owner.sandboxes(claim_ref="default/c1")
    assert claim_id == public_id(record.id)  # the SDK's spelling of the agent's id

    with httpx.Client(base_url=fleet.url, headers=AUTH, verify=trusting()) as http:
        body = yaml.safe_load(manifest.read_text()) | {"metadata": {"generateName": "g-"}}
        answer = http.post("/apis/agents.x-k8s.io/v1beta1/namespaces/default/sandboxes", json=body)
    assert answer.status_code == 201, answer.text
    assert answer.json()["metadata"]["name"].startswith("g-")

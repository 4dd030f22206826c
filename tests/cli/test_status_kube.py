"""``sandboxctl status --source kube`` and ``inventory --source kube`` against the real
control plane: the view of published NodeInventory objects, judged by the
freshness rule, and an API server without the resource named for what it lacks."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from kubernetes import client

from sandboxctl.core.model import Entry, NodeInventory, Pool, PoolKey
from sandboxctl.publisher import published_object
from sandboxctl_testing.controlplane import ControlPlane
from tests.cli.conftest import Run
from tests.testing.realkube import RealKube as Kube
from tests.testing.realkube import kube  # noqa: F401

pytestmark = pytest.mark.services
NI = ("sandbox.cocoonstack.io", "v1beta1", "nodeinventories")


def put(kube: Kube, inventory: NodeInventory) -> None:  # noqa: F811 (the fixture's name)
    client.CustomObjectsApi(kube.api).patch_cluster_custom_object(
        *NI,
        inventory.node,
        published_object(inventory),
        field_manager="test",
        force=True,
        _content_type="application/apply-patch+yaml",
    )


def test_status_judges_the_published_inventories(run: Run, kube: Kube) -> None:  # noqa: F811
    now = datetime.now(UTC).replace(microsecond=0)
    put(
        kube,
        NodeInventory(
            node="node-a",
            address="10.0.0.1:7777",
            pools=(Pool(PoolKey("python"), warm=1, target=3),),
            templates=({"template": "python", "digest": "abc123", "sizeBytes": 2**20},),
            entries=(
                Entry(name="team/a", phase="Running", id="sb_a"),
                Entry(name="team/b", phase="Hibernated", id="sb_b"),
            ),
            published_at=now,
        ),
    )
    put(kube, NodeInventory(node="node-b", address="10.0.0.2:7777",
                            published_at=now - timedelta(minutes=5)))  # fmt: skip

    result = run("status", "--source", "kube", "--kubeconfig", str(kube.kubeconfig), "-o", "json")

    assert result.code == 0, result.err
    document = json.loads(result.out)
    assert document["source"] == f"the NodeInventory objects at {kube.url}"
    assert document["endpoints"] == [
        {"name": "Kubernetes API", "url": kube.url, "up": True, "problem": ""}
    ]
    assert [(n["node"], n["state"], n["sandboxes"]) for n in document["nodes"]] == [
        ("node-a", "fresh", 2),
        ("node-b", "stale", 0),
    ]
    assert document["pools"] == [
        {"node": "node-a", "template": "python", "net": "none", "size": "small",
         "warm": 1, "target": 3}
    ]  # fmt: skip
    assert document["sandboxes"] == {"total": 2, "byState": {"Hibernated": 1, "Running": 1}}
    assert document["templates"] == [
        {"template": "python", "nodes": ["node-a"], "digest": "abc123", "sizeBytes": 2**20}
    ]

    table = run("status", "--source", "kube", "--kubeconfig", str(kube.kubeconfig))
    assert table.code == 0, table.err
    assert "sandboxes: 2 (1 Hibernated, 1 Running)" in table.out
    rows = {line.split()[0]: line.split() for line in table.out.splitlines() if line.strip()}
    assert rows["node-b"][2] == "stale"
    assert rows["python/none/small"][1:] == ["node-a", "1", "3"]


def test_an_api_server_without_the_crd_is_named(run: Run, tmp_path: Path) -> None:
    with ControlPlane(tmp_path, crds=[]) as bare:
        kubeconfig = bare.kubeconfig
        result = run("inventory", "--source", "kube", "--kubeconfig", str(kubeconfig))

    assert result.code == 2
    assert result.err == (
        f"sandboxctl: error: --kubeconfig {kubeconfig} reaches {bare.url}, which does not "
        "serve nodeinventories.sandbox.cocoonstack.io: is the CRD installed (kubectl apply "
        "-f manifests/crds)?\n"
    )

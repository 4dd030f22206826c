"""``sandboxctl inventory --source kube``: one list of NodeInventory objects, judged by
the same rule as files; and ``publish --once`` for cron."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from kubernetes import client

from sandboxctl.core.model import NodeInventory
from sandboxctl.publisher import published_object
from tests.cli.conftest import Run
from tests.testing.kubeapi.double import (
    Kube,
)

NI = ("sandbox.cocoonstack.io", "v1beta1", "nodeinventories")
NOW = datetime.now(UTC).replace(microsecond=0)


def put(kube: Kube, node: str, age: int) -> None:
    inventory = NodeInventory(
        node=node, address=f"{node}:7777", published_at=NOW - timedelta(seconds=age)
    )
    client.CustomObjectsApi(kube.api).create_cluster_custom_object(*NI, published_object(inventory))


def test_inventory_reads_the_cluster(run: Run, kube: Kube) -> None:
    put(kube, "fresh", 5)
    put(kube, "stale", 300)
    result = run(
        "inventory",
        "--source",
        "kube",
        "--kubeconfig",
        str(kube.kubeconfig),
        "-o",
        "json",
        "--fail-on-stale",
    )
    assert result.code == 3
    report = json.loads(result.out)
    assert {n["node"]: n["state"] for n in report["nodes"]} == {"fresh": "fresh", "stale": "stale"}


def test_inventory_source_flags_are_one_line(run: Run, kube: Kube) -> None:
    both = run(
        "inventory", "--source", "kube", "--kubeconfig", str(kube.kubeconfig), "--from", "x.yaml"
    )
    assert both.code == 2
    assert "--from is for --source file" in both.err
    neither = run("inventory")
    assert neither.code == 2
    assert "--from PATH is required" in neither.err


def test_publish_once_without_an_agent_publishes_nothing(run: Run, kube: Kube) -> None:
    result = run(
        "publish",
        "--node",
        "n1",
        "--sandboxd",
        "http://127.0.0.1:9",
        "--kubeconfig",
        str(kube.kubeconfig),
        "--once",
        "--interval",
        "1s",
    )
    assert result.code == 1
    [line] = result.err.strip().splitlines()[-1:]
    assert line.startswith("sandboxctl: published nothing: agent:")
    assert client.CustomObjectsApi(kube.api).list_cluster_custom_object(*NI)["items"] == []

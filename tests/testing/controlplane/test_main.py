"""``python -m sandboxctl_testing.controlplane`` as the local lane kit runs it: ready once
its control endpoint answers, plane.json names the versions, a service account's
kubeconfig has the rights --apply gave it and no more, kube-apiserver stops and starts
through the endpoint, and SIGTERM takes every part down."""

from __future__ import annotations

import json
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from sandboxctl.lanes.processes import Process, free_port
from sandboxctl_testing.controlplane import Tools

REPO = Path(__file__).resolve().parents[3]
NI = ("sandbox.cocoonstack.io", "v1beta1", "nodeinventories")

needs_the_tools = pytest.mark.skipif(
    bool(Tools.find().missing(("etcd", "kube-apiserver"))),
    reason="the real control plane's tools are not built (make kube-tools)",
)


@needs_the_tools
def test_the_plane_as_a_process_serves_applies_stops_and_starts(tmp_path: Path) -> None:
    control = f"http://127.0.0.1:{free_port()}"
    plane = Process(
        "controlplane",
        [
            "--workdir", str(tmp_path / "plane"),
            "--control", control.removeprefix("http://"),
            "--crds", str(REPO / "manifests" / "crds"),
            "--apply", str(REPO / "manifests" / "base" / "namespace.yaml"),
            "--apply", str(REPO / "manifests" / "base" / "rbac-publisher.yaml"),
            "--namespace", "sandbox-system",
            "--service-account", "publisher=sandbox-system/sandboxctl-publisher",
        ],
        f"{control}/healthz",
        tmp_path,
        module="sandboxctl_testing.controlplane",
    )  # fmt: skip
    (tmp_path / "plane").mkdir()
    try:
        plane.start()
        facts = json.loads((tmp_path / "plane" / "plane.json").read_text())
        assert facts["name"].startswith("kube-apiserver v1.")
        assert " + etcd 3." in facts["name"]
        assert httpx.get(f"{control}/plane").json() == facts
        publisher = client.CustomObjectsApi(
            config.new_client_from_config(facts["kubeconfigs"]["publisher"])
        )
        body = {"apiVersion": f"{NI[0]}/{NI[1]}", "kind": "NodeInventory",
                "metadata": {"name": "n1"}, "node": "n1", "address": "127.0.0.1:1"}  # fmt: skip
        publisher.create_cluster_custom_object(*NI, body)  # the role's create
        with pytest.raises(ApiException) as refused:
            publisher.list_cluster_custom_object(*NI)  # a publisher never reads
        assert refused.value.status == 403

        assert httpx.post(f"{control}/kube-apiserver/stop", timeout=60).status_code == 200
        with pytest.raises(httpx.ConnectError):
            httpx.get(facts["url"] + "/readyz", verify=False, timeout=5)
        assert httpx.post(f"{control}/kube-apiserver/start", timeout=90).status_code == 200
        assert httpx.post(f"{control}/etcd/start", timeout=90).status_code == 200  # up: a no-op
        # The admin's certificate files plane.json names are the ones kube-apiserver takes.
        context = ssl.create_default_context(cafile=facts["ca"])
        context.load_cert_chain(facts["admin"]["cert"], facts["admin"]["key"])
        with httpx.Client(verify=context, timeout=10) as http:
            assert http.get(facts["url"] + "/readyz").status_code == 200
        admin = client.CustomObjectsApi(config.new_client_from_config(facts["admin"]["kubeconfig"]))
        assert [o["metadata"]["name"] for o in admin.list_cluster_custom_object(*NI)["items"]] == [
            "n1"
        ]  # the data outlived the outage
        assert httpx.post(f"{control}/proxy/stop", timeout=10).status_code == 404
    finally:
        plane.stop(signal.SIGTERM, timeout=60)
    for program in ("etcd", "kube-apiserver"):  # SIGTERM took every part down
        assert not _running(program, tmp_path)


def _running(program: str, workdir: Path) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = subprocess.run(["pgrep", "-f", f"{program}.*{workdir}"], capture_output=True)
        if found.returncode != 0:
            return False
        time.sleep(0.2)
    return True


def test_the_tools_check_exits_3_with_the_line_that_names_make_kube_tools(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sandboxctl_testing.controlplane", "--check-tools"],
        capture_output=True, text=True, check=False,
        env={"SANDBOXCTL_KUBE_TOOLS": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 3
    assert "`make kube-tools`" in done.stdout
    assert len(done.stdout.strip().splitlines()) == 1

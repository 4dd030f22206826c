"""The real control plane itself: ready means ready, users are who their certificates say
and RBAC judges them, an outage of kube-apiserver or etcd ends where it began, and a
compaction expires an old watch with 410."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client, config

from sandboxctl_testing.controlplane import ControlPlane, MissingTools, Tools
from tests.testing.realkube import PLANE_NODE, RealKube

NI = ("sandbox.cocoonstack.io", "v1beta1", "nodeinventories")


def inventory(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{NI[0]}/{NI[1]}",
        "kind": "NodeInventory",
        "metadata": {"name": name},
        "node": name,
        "address": "127.0.0.1:1",
    }


def objects_as(kubeconfig: Path) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(config.new_client_from_config(str(kubeconfig)))


def test_ready_means_the_crds_are_established_and_the_fake_node_is_ready(
    real_kube: RealKube,
) -> None:
    with real_kube.http() as http:
        assert http.get("/readyz").status_code == 200
        version = http.get("/version").json()
    assert version["gitVersion"].startswith("v1.35.")
    node = client.CoreV1Api(real_kube.api).read_node(PLANE_NODE)
    assert {c.type: c.status for c in node.status.conditions}["Ready"] == "True"
    crds = client.ApiextensionsV1Api(real_kube.api).list_custom_resource_definition()
    names = {crd.metadata.name for crd in crds.items}
    assert {"nodeinventories.sandbox.cocoonstack.io", "nodepools.karpenter.sh"} <= names


def test_a_user_is_what_its_certificate_says_and_rbac_judges_it(real_kube: RealKube) -> None:
    plane = real_kube.plane
    stranger = objects_as(plane.kubeconfig_for("stranger", ["team-a"]))
    with pytest.raises(client.ApiException) as refused:
        stranger.list_cluster_custom_object(*NI)
    assert refused.value.status == 403
    assert 'User "stranger"' in json.loads(refused.value.body)["message"]
    rbac = client.RbacAuthorizationV1Api(real_kube.api)
    rbac.create_cluster_role(
        {
            "metadata": {"name": "read-inventories"},
            "rules": [{"apiGroups": [NI[0]], "resources": [NI[2]], "verbs": ["list"]}],
        }
    )
    group = "rbac.authorization.k8s.io"
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": "team-a-reads"},
            "roleRef": {"apiGroup": group, "kind": "ClusterRole", "name": "read-inventories"},
            "subjects": [{"apiGroup": group, "kind": "Group", "name": "team-a"}],
        }
    )
    deadline = time.monotonic() + 10  # RBAC reads its informer's cache
    while True:
        try:
            assert stranger.list_cluster_custom_object(*NI)["items"] == []
            break
        except client.ApiException as error:
            if error.status != 403 or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_the_schema_is_enforced_for_real(real_kube: RealKube) -> None:
    objects = client.CustomObjectsApi(real_kube.api)
    bad = {**inventory("n1"), "address": 7}
    with pytest.raises(client.ApiException) as refused:
        objects.create_cluster_custom_object(*NI, bad)
    assert refused.value.status == 422


def test_an_apiserver_outage_ends_with_the_data_where_it_was(real_kube: RealKube) -> None:
    plane = real_kube.plane
    objects = client.CustomObjectsApi(real_kube.api)
    objects.create_cluster_custom_object(*NI, inventory("n1"))
    plane.stop_apiserver()
    with pytest.raises(urllib3.exceptions.HTTPError):  # refused: nobody listens
        objects.list_cluster_custom_object(*NI, _request_timeout=2)
    plane.start_apiserver()
    names = [o["metadata"]["name"] for o in objects.list_cluster_custom_object(*NI)["items"]]
    assert names == ["n1"]


def test_an_etcd_outage_makes_the_apiserver_unready_until_it_ends(real_kube: RealKube) -> None:
    plane = real_kube.plane
    plane.stop_etcd()
    try:
        deadline = time.monotonic() + 30
        with plane.http() as http:
            while http.get("/readyz").status_code == 200:
                assert time.monotonic() < deadline, "readyz stayed 200 without etcd"
                time.sleep(0.1)
    finally:
        plane.start_etcd()
    deadline = time.monotonic() + 30
    with plane.http() as http:
        while http.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "readyz did not come back with etcd"
            time.sleep(0.1)


def test_a_watch_from_before_a_compaction_is_410(uncached_kube: RealKube) -> None:
    real_kube = uncached_kube
    objects = client.CustomObjectsApi(real_kube.api)
    first = objects.create_cluster_custom_object(*NI, inventory("n1"))
    old = first["metadata"]["resourceVersion"]
    for index in range(3):
        objects.patch_cluster_custom_object(*NI, "n1", {"address": f"127.0.0.1:{index + 2}"})
    real_kube.plane.compact()
    with real_kube.http() as http:
        path = f"/apis/{NI[0]}/{NI[1]}/{NI[2]}?watch=1&resourceVersion={old}&timeoutSeconds=5"
        with http.stream("GET", path) as answer:
            first_line = next(answer.iter_lines())
    event = json.loads(first_line)
    assert event["type"] == "ERROR"
    assert event["object"]["code"] == 410


def test_missing_tools_say_how_to_get_them(tmp_path: Path) -> None:
    with pytest.raises(MissingTools, match="make kube-tools"):
        ControlPlane(tmp_path, tools=Tools(tmp_path / "empty"))


def test_with_the_controller_manager_a_deployment_gets_pods_that_kwok_runs(
    tmp_path: Path,
) -> None:
    plane = ControlPlane(tmp_path, scheduler=True, controller_manager=True, kwok=True)
    with plane:
        api = plane.api()
        apps = client.AppsV1Api(api)
        labels = {"app": "probe"}
        apps.create_namespaced_deployment(
            "default",
            {
                "metadata": {"name": "probe"},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {"containers": [{"name": "c", "image": "none"}]},
                    },
                },
            },
        )
        deadline = time.monotonic() + 60
        while (apps.read_namespaced_deployment("probe", "default").status.ready_replicas or 0) < 2:
            assert time.monotonic() < deadline, "the deployment's pods never ran"
            time.sleep(0.1)
        pods = client.CoreV1Api(api).list_namespaced_pod("default", label_selector="app=probe")
        assert {p.spec.node_name for p in pods.items} == {"kwok-node-0"}
        api.close()

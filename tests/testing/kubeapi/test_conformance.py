"""The double's conformance: the same scenarios through the official client and through
real kubectl (the pinned 1.35, and the machine's 1.32 when it has one): what sandboxctl's own
clients and kubectl ask of a cluster. The namespaced resource with a status subresource is
SandboxWarmPool, the cluster-scoped one NodeInventory."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, watch

from tests.testing.kubeapi.conftest import BACKENDS
from tests.testing.kubeapi.double import PINNED_KUBECTL, Kube, Kubectl, second_kubectl
from tests.testing.realkube import RealKube

G, V, POOLS = "extensions.agents.x-k8s.io", "v1beta1", "sandboxwarmpools"
NI = ("sandbox.cocoonstack.io", "v1beta1", "nodeinventories")
CONFLICT = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


def pool(
    name: str, labels: dict[str, str] | None = None, replicas: int = 1, **meta: Any
) -> dict[str, Any]:
    return {
        "apiVersion": f"{G}/{V}",
        "kind": "SandboxWarmPool",
        "metadata": {"name": name, "labels": labels or {}, **meta},
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": "base"}},
    }


@pytest.fixture
def objects(kube: Kube) -> client.CustomObjectsApi:
    api = client.CustomObjectsApi(kube.api)
    api.create_namespaced_custom_object(G, V, "default", POOLS, pool("a1", {"app": "a"}))
    return api


def status_of(error: client.ApiException) -> dict[str, Any]:
    return json.loads(error.body)  # type: ignore[no-any-return]


# --- the official client -------------------------------------------------------------------


def test_create_sets_the_server_fields(objects: client.CustomObjectsApi) -> None:
    a1 = objects.get_namespaced_custom_object(G, V, "default", POOLS, "a1")
    meta = a1["metadata"]
    assert {"resourceVersion", "uid", "creationTimestamp", "generation"} <= meta.keys()
    assert meta["namespace"] == "default"
    assert meta["generation"] == 1


def test_duplicate_create_and_missing_get(objects: client.CustomObjectsApi) -> None:
    with pytest.raises(client.ApiException) as duplicate:
        objects.create_namespaced_custom_object(G, V, "default", POOLS, pool("a1"))
    assert duplicate.value.status == 409
    assert status_of(duplicate.value)["reason"] == "AlreadyExists"
    with pytest.raises(client.ApiException) as missing:
        objects.get_namespaced_custom_object(G, V, "default", POOLS, "nope")
    assert missing.value.status == 404
    assert status_of(missing.value)["message"] == f'{POOLS}.{G} "nope" not found'


def test_label_and_field_selectors(objects: client.CustomObjectsApi) -> None:
    objects.create_namespaced_custom_object(G, V, "default", POOLS, pool("b1", {"app": "b"}))
    listed = objects.list_namespaced_custom_object(G, V, "default", POOLS, label_selector="app=b")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["b1"]
    assert listed["kind"] == "SandboxWarmPoolList"
    assert listed["metadata"]["resourceVersion"]
    both = objects.list_namespaced_custom_object(
        G, V, "default", POOLS, label_selector="app in (a,b),!missing"
    )
    assert [i["metadata"]["name"] for i in both["items"]] == ["a1", "b1"]
    pinned = objects.list_namespaced_custom_object(
        G, V, "default", POOLS, field_selector="metadata.name=a1"
    )
    assert [i["metadata"]["name"] for i in pinned["items"]] == ["a1"]
    with pytest.raises(client.ApiException) as unknown:
        objects.list_namespaced_custom_object(
            G, V, "default", POOLS, field_selector="spec.replicas=1"
        )
    assert unknown.value.status == 400


def test_merge_patches_and_a_stale_one(objects: client.CustomObjectsApi) -> None:
    before = objects.get_namespaced_custom_object(G, V, "default", POOLS, "a1")
    patched = objects.patch_namespaced_custom_object(
        G,
        V,
        "default",
        POOLS,
        "a1",
        {"metadata": {"labels": {"tier": "gold"}}, "spec": {"replicas": 4}},
    )
    assert patched["spec"] == {"replicas": 4, "sandboxTemplateRef": {"name": "base"}}
    assert patched["metadata"]["labels"] == {"app": "a", "tier": "gold"}
    assert patched["metadata"]["resourceVersion"] != before["metadata"]["resourceVersion"]
    assert patched["metadata"]["generation"] == 2
    dropped = objects.patch_namespaced_custom_object(
        G, V, "default", POOLS, "a1", {"metadata": {"labels": {"tier": None}}}
    )
    assert dropped["metadata"]["labels"] == {"app": "a"}
    with pytest.raises(client.ApiException) as stale:
        objects.patch_namespaced_custom_object(
            G,
            V,
            "default",
            POOLS,
            "a1",
            {"metadata": {"resourceVersion": before["metadata"]["resourceVersion"]}},
        )
    assert stale.value.status == 409
    assert status_of(stale.value)["message"].endswith(CONFLICT)


def test_json_patch_with_a_failing_test(objects: client.CustomObjectsApi) -> None:
    done = objects.patch_namespaced_custom_object(
        G,
        V,
        "default",
        POOLS,
        "a1",
        [{"op": "replace", "path": "/spec/replicas", "value": 9}],
        _content_type="application/json-patch+json",
    )
    assert done["spec"]["replicas"] == 9
    with pytest.raises(client.ApiException) as failed:
        objects.patch_namespaced_custom_object(
            G,
            V,
            "default",
            POOLS,
            "a1",
            [{"op": "test", "path": "/spec/replicas", "value": 1}],
            _content_type="application/json-patch+json",
        )
    assert failed.value.status == 422


def test_replace_and_a_stale_replace(objects: client.CustomObjectsApi) -> None:
    current = objects.get_namespaced_custom_object(G, V, "default", POOLS, "a1")
    body = {**current, "spec": {"sandboxTemplateRef": {"name": "python"}}}
    replaced = objects.replace_namespaced_custom_object(G, V, "default", POOLS, "a1", body)
    assert replaced["spec"] == {"sandboxTemplateRef": {"name": "python"}}  # replicas dropped
    with pytest.raises(client.ApiException) as stale:
        objects.replace_namespaced_custom_object(G, V, "default", POOLS, "a1", body)
    assert stale.value.status == 409
    assert status_of(stale.value)["reason"] == "Conflict"


def test_server_side_apply_creates(objects: client.CustomObjectsApi) -> None:
    created = objects.patch_namespaced_custom_object(
        G,
        V,
        "default",
        POOLS,
        "ap1",
        pool("ap1", replicas=3),
        field_manager="tester",
        force=True,
        _content_type="application/apply-patch+yaml",
    )
    assert created is None  # 201, which the client does not read back
    got = objects.get_namespaced_custom_object(G, V, "default", POOLS, "ap1")
    assert got["spec"]["replicas"] == 3
    assert [m["manager"] for m in got["metadata"]["managedFields"]] == ["tester"]


def test_status_subresource(objects: client.CustomObjectsApi) -> None:
    patched = objects.patch_namespaced_custom_object_status(
        G, V, "default", POOLS, "a1", {"status": {"readyReplicas": 1}, "spec": {"replicas": 7}}
    )
    assert patched["status"] == {"readyReplicas": 1}
    assert patched["spec"]["replicas"] == 1  # a status write changes only the status
    main = objects.patch_namespaced_custom_object(
        G, V, "default", POOLS, "a1", {"status": {"readyReplicas": 5}}
    )
    assert main["status"] == {"readyReplicas": 1}  # a main write keeps the status


def test_cluster_scoped(kube: Kube) -> None:
    api = client.CustomObjectsApi(kube.api)
    body = {
        "apiVersion": f"{NI[0]}/{NI[1]}",
        "kind": "NodeInventory",
        "metadata": {"name": "n1"},
        "node": "n1",
    }
    created = api.create_cluster_custom_object(*NI, body)
    assert "namespace" not in created["metadata"]
    assert api.get_cluster_custom_object(*NI, "n1")["node"] == "n1"
    assert [i["node"] for i in api.list_cluster_custom_object(*NI)["items"]] == ["n1"]


def test_watch_from_a_list_sees_only_what_follows(objects: client.CustomObjectsApi) -> None:
    version = objects.list_namespaced_custom_object(G, V, "default", POOLS)["metadata"][
        "resourceVersion"
    ]

    def writes() -> None:
        objects.create_namespaced_custom_object(G, V, "default", POOLS, pool("w1"))
        objects.patch_namespaced_custom_object(
            G, V, "default", POOLS, "w1", {"spec": {"replicas": 2}}
        )
        objects.delete_namespaced_custom_object(G, V, "default", POOLS, "w1")

    threading.Thread(target=writes).start()
    seen = []
    for event in watch.Watch().stream(
        objects.list_namespaced_custom_object,
        G,
        V,
        "default",
        POOLS,
        resource_version=version,
        allow_watch_bookmarks=True,
        timeout_seconds=2,
    ):
        if event["type"] != "BOOKMARK":
            seen.append((event["type"], event["object"]["metadata"]["name"]))
    assert seen == [("ADDED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")]


def test_watch_honours_its_timeout_and_selector(objects: client.CustomObjectsApi) -> None:
    threading.Timer(
        0.3,
        lambda: objects.create_namespaced_custom_object(
            G, V, "default", POOLS, pool("m1", {"app": "m"})
        ),
    ).start()
    threading.Timer(
        0.4,
        lambda: objects.create_namespaced_custom_object(
            G, V, "default", POOLS, pool("o1", {"app": "o"})
        ),
    ).start()
    started = time.monotonic()
    names = [
        e["object"]["metadata"]["name"]
        for e in watch.Watch().stream(
            objects.list_namespaced_custom_object,
            G,
            V,
            "default",
            POOLS,
            label_selector="app=m",
            timeout_seconds=2,
        )
    ]
    assert time.monotonic() - started < 3.5
    assert names == ["m1"]


@pytest.fixture(params=BACKENDS)
def expiring(request: pytest.FixtureRequest) -> Kube | RealKube:
    """A backend whose compaction expires old watches: the double, or a plane without the
    watch cache (with it, kube-apiserver serves watches from memory)."""
    fixture = "double_kube" if request.param == "double" else "uncached_kube"
    backend: Kube | RealKube = request.getfixturevalue(fixture)
    return backend


def test_watch_from_a_too_old_version_is_410(expiring: Kube | RealKube) -> None:
    objects = client.CustomObjectsApi(expiring.api)
    created = objects.create_namespaced_custom_object(G, V, "default", POOLS, pool("old1"))
    objects.patch_namespaced_custom_object(
        G, V, "default", POOLS, "old1", {"spec": {"replicas": 2}}
    )
    objects.patch_namespaced_custom_object(
        G, V, "default", POOLS, "old1", {"spec": {"replicas": 3}}
    )
    if isinstance(expiring, RealKube):
        expiring.plane.compact()
    else:
        expiring.store.compact()
    with pytest.raises(client.ApiException) as gone:
        for _ in watch.Watch().stream(
            objects.list_namespaced_custom_object,
            G,
            V,
            "default",
            POOLS,
            resource_version=created["metadata"]["resourceVersion"],
            timeout_seconds=2,
        ):
            pass
    assert gone.value.status == 410


def test_delete_and_finalizers(objects: client.CustomObjectsApi) -> None:
    objects.delete_namespaced_custom_object(G, V, "default", POOLS, "a1")
    with pytest.raises(client.ApiException) as gone:
        objects.get_namespaced_custom_object(G, V, "default", POOLS, "a1")
    assert gone.value.status == 404
    objects.create_namespaced_custom_object(
        G, V, "default", POOLS, pool("f1", finalizers=["test/hold"])
    )
    objects.delete_namespaced_custom_object(G, V, "default", POOLS, "f1")
    held = objects.get_namespaced_custom_object(G, V, "default", POOLS, "f1")
    assert held["metadata"]["deletionTimestamp"]
    objects.patch_namespaced_custom_object(
        G, V, "default", POOLS, "f1", {"metadata": {"finalizers": None}}
    )
    with pytest.raises(client.ApiException) as removed:
        objects.get_namespaced_custom_object(G, V, "default", POOLS, "f1")
    assert removed.value.status == 404


def test_pods_typed_with_a_strategic_merge_and_a_typed_watch(kube: Kube) -> None:
    core = client.CoreV1Api(kube.api)
    container = client.V1Container(name="c", image="busybox")
    core.create_namespaced_pod(
        "default",
        client.V1Pod(
            metadata=client.V1ObjectMeta(name="p1", labels={"app": "p"}),
            # No scheduler has this name: on a real cluster nothing binds or runs the pod,
            # so the watch below sees only the test's own change.
            spec=client.V1PodSpec(containers=[container], scheduler_name="nobody"),
        ),
    )
    assert [
        p.metadata.name for p in core.list_namespaced_pod("default", label_selector="app=p").items
    ] == ["p1"]
    version = core.list_namespaced_pod("default").metadata.resource_version
    patched = core.patch_namespaced_pod(
        "p1", "default", {"metadata": {"labels": {"tier": "x"}, "annotations": {"a": "b"}}}
    )
    assert patched.metadata.labels == {"app": "p", "tier": "x"}
    events = list(
        watch.Watch().stream(
            core.list_namespaced_pod,
            "default",
            label_selector="app=p",
            resource_version=version,
            timeout_seconds=1,
        )
    )
    assert [(e["type"], type(e["object"]).__name__) for e in events] == [("MODIFIED", "V1Pod")]
    # The typed client refuses this pod itself, so it goes as plain HTTP.
    bad = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad"}, "spec": {}}
    with kube.http() as http:
        refused = http.post("/api/v1/namespaces/default/pods", json=bad)
    assert refused.status_code == 422
    assert refused.json()["reason"] == "Invalid"


def test_lease_replace_and_a_stale_replace(kube: Kube) -> None:
    leases = client.CoordinationV1Api(kube.api)
    lease = leases.create_namespaced_lease(
        "default",
        client.V1Lease(
            metadata=client.V1ObjectMeta(name="l1"), spec=client.V1LeaseSpec(holder_identity="a")
        ),
    )
    read = leases.read_namespaced_lease("l1", "default")
    read.spec.holder_identity = "b"
    replaced = leases.replace_namespaced_lease("l1", "default", read)
    assert replaced.spec.holder_identity == "b"
    with pytest.raises(client.ApiException) as stale:
        leases.replace_namespaced_lease("l1", "default", lease)
    assert stale.value.status == 409
    assert client.VersionApi(kube.api).get_code().minor == "35"


# --- real kubectl ----------------------------------------------------------------------------


def _kubectl_versions() -> list[Any]:
    pinned = pytest.param(
        PINNED_KUBECTL,
        id="kubectl-1.35",
        marks=pytest.mark.skipif(
            not PINNED_KUBECTL.exists(),
            reason="needs the pinned kubectl in .tools/bin (make kubectl)",
        ),
    )
    second = second_kubectl()
    other = pytest.param(
        second,
        id="kubectl-1.32",
        marks=pytest.mark.skipif(
            second is None,
            reason="no second kubectl: the machine's Debian kubectl package (Google Cloud SDK) "
            "ships "
            "kubectl.1.32; or set SANDBOXCTL_SECOND_KUBECTL",
        ),
    )
    return [pinned, other]


@pytest.fixture(params=_kubectl_versions())
def kubectl(request: pytest.FixtureRequest, kube: Kube, tmp_path: Path) -> Kubectl:
    binary = request.param
    return Kubectl(binary, kube.kubeconfig, tmp_path)


def manifest(name: str, labels: str = "", finalizer: bool = False) -> str:
    body = pool(name)
    if labels:
        body["metadata"]["labels"] = dict(kv.split("=") for kv in labels.split(","))
    if finalizer:
        body["metadata"]["finalizers"] = ["test/hold"]
    return yaml.safe_dump(body)


def test_kubectl_reads(kubectl: Kubectl) -> None:
    assert kubectl("create", "-f", "-", stdin=manifest("a1", "tier=gold")).returncode == 0
    assert kubectl("create", "-f", "-", stdin=manifest("a2")).returncode == 0
    listed = kubectl("get", "sandboxwarmpools")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split("\n")[0].split() == ["NAME", "TEMPLATE", "DESIRED", "READY", "AGE"]
    assert [line.split()[0] for line in listed.stdout.strip().split("\n")[1:]] == ["a1", "a2"]
    assert kubectl("get", "swp", "-l", "tier=gold", "-o", "name").stdout.split() == [
        f"sandboxwarmpool.{G}/a1"
    ]
    assert (
        kubectl("get", "swp", "a1", "-o", "jsonpath={.spec.sandboxTemplateRef.name}").stdout
        == "base"
    )
    assert (
        yaml.safe_load(kubectl("get", "swp", "a1", "-o", "yaml").stdout)["metadata"]["name"] == "a1"
    )
    shown = kubectl("get", "swp", "-A", "--show-labels").stdout
    assert "tier=gold" in shown
    assert "default" in shown
    resources = kubectl("api-resources").stdout
    assert "nodeinventories" in resources
    assert "leases" in resources
    assert kubectl("get", "nodeinventories").returncode == 0
    assert kubectl("get", "leases", "-A").returncode == 0
    duplicate = kubectl("create", "-f", "-", stdin=manifest("a1"))
    assert duplicate.returncode != 0
    assert "AlreadyExists" in duplicate.stderr


def test_kubectl_writes(kubectl: Kubectl) -> None:
    assert kubectl("apply", "-f", "-", stdin=manifest("ap1")).returncode == 0
    applied = kubectl("apply", "--server-side", "-f", "-", stdin=manifest("ap2"))
    assert applied.returncode == 0, applied.stderr
    assert "serverside-applied" in applied.stdout
    assert (
        kubectl("patch", "swp", "ap1", "--type=merge", "-p", '{"spec":{"replicas":5}}').returncode
        == 0
    )
    assert kubectl("label", "swp", "ap1", "tier=gold").returncode == 0
    assert kubectl("annotate", "swp", "ap1", "note=x").returncode == 0
    got = yaml.safe_load(kubectl("get", "swp", "ap1", "-o", "yaml").stdout)
    assert got["spec"]["replicas"] == 5
    assert got["metadata"]["labels"]["tier"] == "gold"
    assert got["metadata"]["annotations"]["note"] == "x"
    refused = kubectl(
        "apply", "-f", "-", stdin=manifest("ap3").replace("replicas: 1", "replicas: -1")
    )
    assert refused.returncode != 0
    assert "replicas" in refused.stderr


def test_kubectl_watch_wait_and_delete(kubectl: Kubectl, kube: Kube) -> None:
    objects = client.CustomObjectsApi(kube.api)
    objects.create_namespaced_custom_object(G, V, "default", POOLS, pool("a1"))
    watching = kubectl.start("get", "swp", "-w", "--request-timeout=0")
    try:
        time.sleep(0.5)  # let the watch open before the writes it must see
        objects.create_namespaced_custom_object(G, V, "default", POOLS, pool("w1"))
        objects.patch_namespaced_custom_object_status(
            G, V, "default", POOLS, "w1", {"status": {"readyReplicas": 1}}
        )
        objects.delete_namespaced_custom_object(G, V, "default", POOLS, "w1")
        time.sleep(1)
    finally:
        watching.terminate()
        out, _ = watching.communicate(timeout=10)
    rows = [line.split()[0] for line in out.strip().split("\n")[1:]]
    assert rows[:1] == ["a1"]
    assert rows.count("w1") >= 3, out
    threading.Timer(
        1.0, lambda: objects.delete_namespaced_custom_object(G, V, "default", POOLS, "a1")
    ).start()
    waited = kubectl("wait", "--for=delete", "swp/a1", "--timeout=15s")
    assert waited.returncode == 0, waited.stderr
    objects.create_namespaced_custom_object(
        G, V, "default", POOLS, pool("f1", finalizers=["test/hold"])
    )
    threading.Timer(
        1.0,
        lambda: objects.patch_namespaced_custom_object(
            G, V, "default", POOLS, "f1", {"metadata": {"finalizers": None}}
        ),
    ).start()
    deleted = kubectl("delete", "swp", "f1", timeout=20)
    assert deleted.returncode == 0, deleted.stderr
    assert '"f1" deleted' in deleted.stdout

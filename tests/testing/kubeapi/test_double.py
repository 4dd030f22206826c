"""Beyond the conformance scenarios: field managers, CRD schemas, dry runs and CRDs made
through the API (on the double and the real control plane alike), and what only the
double has: its static tokens with TokenReview and SubjectAccessReview, its watch hooks,
and its state file across a stop and a start."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client

from tests.testing.kubeapi.double import DoubleProcess, Kube, api_for
from tests.testing.realkube import RealKube

NI = ("sandbox.cocoonstack.io", "v1beta1", "nodeinventories")
APPLY = "application/apply-patch+yaml"


def inventory(name: str, **fields: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{NI[0]}/{NI[1]}",
        "kind": "NodeInventory",
        "metadata": {"name": name},
        "node": name,
        **fields,
    }


def apply(
    api: client.CustomObjectsApi, body: dict[str, Any], manager: str, force: bool = True
) -> None:
    api.patch_cluster_custom_object(
        *NI, body["metadata"]["name"], body, field_manager=manager, force=force, _content_type=APPLY
    )


def call(kube: Kube | RealKube, method: str, path: str, **options: Any) -> httpx.Response:
    with kube.http() as http:
        return http.request(method, path, **options)


def managers(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["manager"]: m["fieldsV1"] for m in obj["metadata"].get("managedFields", [])}


def test_apply_owns_fields_conflicts_and_removes_what_it_stops_applying(kube: Kube) -> None:
    api = client.CustomObjectsApi(kube.api)
    apply(api, inventory("n1", address="a:1", publishedAt="2026-11-30T04:00:00Z"), "publisher")
    got = api.get_cluster_custom_object(*NI, "n1")
    assert set(managers(got)["publisher"]) == {"f:node", "f:address", "f:publishedAt"}
    # Another manager changing an owned field conflicts unless forced.
    with pytest.raises(client.ApiException) as refused:
        apply(api, inventory("n1", address="b:2"), "intruder", force=False)
    assert refused.value.status == 409
    assert 'conflict with "publisher"' in json.loads(refused.value.body)["message"]
    # The same value is shared ownership, not a conflict.
    apply(api, inventory("n1", address="a:1"), "reader", force=False)
    # The publisher stops applying publishedAt: it is removed (nobody else owns it).
    apply(api, inventory("n1", address="a:1"), "publisher")
    assert "publishedAt" not in api.get_cluster_custom_object(*NI, "n1")
    # A merge patch by someone else takes the field over, without a conflict.
    api.patch_cluster_custom_object(*NI, "n1", {"address": "c:3"})
    after = managers(api.get_cluster_custom_object(*NI, "n1"))
    assert "f:address" not in after["publisher"]
    assert "f:address" in next(v for k, v in after.items() if k not in ("publisher", "reader"))


def test_apply_without_a_field_manager_is_422(kube: Kube) -> None:
    answer = call(
        kube,
        "PATCH",
        f"/apis/{NI[0]}/{NI[1]}/{NI[2]}/n1",
        content=json.dumps(inventory("n1")),
        headers={"Content-Type": APPLY},
    )
    assert answer.status_code == 422
    assert "fieldManager: Required value" in answer.json()["message"]


def test_the_crd_schema_is_enforced(kube: Kube) -> None:
    api = client.CustomObjectsApi(kube.api)
    with pytest.raises(client.ApiException) as wrong_type:
        api.create_cluster_custom_object(*NI, inventory("n1", entries=[{"name": "a", "phase": 3}]))
    assert wrong_type.value.status == 422
    assert "entries[0].phase" in json.loads(wrong_type.value.body)["message"]
    with pytest.raises(client.ApiException) as missing:
        api.create_cluster_custom_object(*NI, {**inventory("n1"), "node": None} | {"address": "x"})
    assert missing.value.status == 422
    # Unknown fields are pruned (and named in a Warning header), or refused when strict.
    created = call(kube, "POST", f"/apis/{NI[0]}/{NI[1]}/{NI[2]}", json=inventory("n2", extra=1))
    assert created.status_code == 201
    assert "extra" not in created.json()
    assert 'unknown field \\"extra\\"' in created.headers["warning"]
    strict = call(
        kube,
        "POST",
        f"/apis/{NI[0]}/{NI[1]}/{NI[2]}?fieldValidation=Strict",
        json=inventory("n3", extra=1),
    )
    assert strict.status_code == 400
    assert 'unknown field "extra"' in strict.json()["message"]


def test_dry_run_stores_nothing(kube: Kube) -> None:
    url = f"/apis/{NI[0]}/{NI[1]}/{NI[2]}"
    before = call(kube, "GET", url).json()["metadata"]["resourceVersion"]
    assert call(kube, "POST", f"{url}?dryRun=All", json=inventory("n1")).status_code == 201
    assert call(kube, "GET", f"{url}/n1").status_code == 404
    assert call(kube, "GET", url).json()["metadata"]["resourceVersion"] == before


def test_crds_created_through_the_api_are_served(kube: Kube) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"size": {"type": "integer"}},
                        }
                    },
                }
            ],
        },
    }
    assert (
        call(
            kube, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd
        ).status_code
        == 201
    )
    url = "/apis/example.com/v1/namespaces/default/widgets"
    deadline = time.monotonic() + 10  # a real kube-apiserver serves a CRD once Established
    while call(kube, "GET", url).status_code == 404 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (
        call(
            kube,
            "POST",
            url,
            json={
                "apiVersion": "example.com/v1",
                "kind": "Widget",
                "metadata": {"name": "w"},
                "size": 2,
            },
        ).status_code
        == 201
    )
    assert (
        call(
            kube,
            "POST",
            url,
            json={
                "apiVersion": "example.com/v1",
                "kind": "Widget",
                "metadata": {"name": "v"},
                "size": "x",
            },
        ).status_code
        == 422
    )
    call(
        kube,
        "DELETE",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com",
    )
    deadline = time.monotonic() + 10  # and stops serving it once its deletion is done
    while call(kube, "GET", url).status_code != 404 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert call(kube, "GET", url).status_code == 404


def test_tokens_rbac_and_the_review_apis(double_kube: Kube, tmp_path: Path) -> None:
    kube = double_kube
    tokens = tmp_path / "tokens.csv"
    tokens.write_text(
        't-pub,system:serviceaccount:sandbox-system:publisher,u1,"system:serviceaccounts"\n'
    )
    kube.running.server.settings.tokens.update(
        __import__("sandboxctl_testing.kubeapi.access", fromlist=["load_tokens"]).load_tokens(
            tokens
        )
    )
    rbac = client.RbacAuthorizationV1Api(kube.api)
    rbac.create_cluster_role(
        client.V1ClusterRole(
            metadata=client.V1ObjectMeta(name="publish"),
            rules=[client.V1PolicyRule(api_groups=[NI[0]], resources=[NI[2]], verbs=["patch"])],
        )
    )
    rbac.create_cluster_role_binding(
        client.V1ClusterRoleBinding(
            metadata=client.V1ObjectMeta(name="publish"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="publish"
            ),
            subjects=[
                client.RbacV1Subject(
                    kind="ServiceAccount", name="publisher", namespace="sandbox-system"
                )
            ],
        )
    )
    publisher = client.CustomObjectsApi(api_for(kube.url, "t-pub"))
    with pytest.raises(client.ApiException) as no_create:
        apply(publisher, inventory("n1"), "p")  # an apply that creates needs create too
    assert no_create.value.status == 403
    client.CustomObjectsApi(kube.api).create_cluster_custom_object(*NI, inventory("n1"))
    apply(publisher, inventory("n1", address="a:1"), "p")  # patch is allowed
    with pytest.raises(client.ApiException) as forbidden:
        publisher.delete_cluster_custom_object(*NI, "n1")
    assert forbidden.value.status == 403
    assert 'cannot delete resource "nodeinventories"' in json.loads(forbidden.value.body)["message"]
    with pytest.raises(client.ApiException) as unknown:
        client.CustomObjectsApi(api_for(kube.url, "nope")).list_cluster_custom_object(*NI)
    assert unknown.value.status == 401
    review = client.AuthenticationV1Api(kube.api).create_token_review(
        client.V1TokenReview(spec=client.V1TokenReviewSpec(token="t-pub"))
    )
    assert review.status.authenticated
    assert review.status.user.username.endswith(":publisher")
    access = client.AuthorizationV1Api(kube.api)

    def may(verb: str) -> bool:
        spec = client.V1SubjectAccessReviewSpec(
            user=review.status.user.username,
            groups=review.status.user.groups,
            resource_attributes=client.V1ResourceAttributes(verb=verb, group=NI[0], resource=NI[2]),
        )
        return bool(
            access.create_subject_access_review(
                client.V1SubjectAccessReview(spec=spec)
            ).status.allowed
        )

    assert may("patch")
    assert not may("delete")


def test_hooks_drop_and_expire_watches(double_kube: Kube) -> None:
    kube = double_kube
    url = f"{kube.url}/apis/{NI[0]}/{NI[1]}/{NI[2]}"
    version = httpx.get(url).json()["metadata"]["resourceVersion"]
    with httpx.stream(
        "GET", f"{url}?watch=1&resourceVersion={version}&timeoutSeconds=10", timeout=10
    ) as stream:
        httpx.post(f"{kube.url}/_fake/expire")
        lines = [json.loads(line) for line in stream.iter_lines() if line]
    assert lines[-1]["type"] == "ERROR"
    assert lines[-1]["object"]["code"] == 410
    with httpx.stream("GET", f"{url}?watch=1&timeoutSeconds=10", timeout=10) as stream:
        httpx.post(f"{kube.url}/_fake/drop-watches")
        with pytest.raises(httpx.RemoteProtocolError):
            list(stream.iter_lines())


def test_the_state_survives_a_restart(state_dir: Path) -> None:
    with DoubleProcess(state_dir) as double:
        api = client.CustomObjectsApi(api_for(double.url))
        api.create_cluster_custom_object(*NI, inventory("n1", address="a:1"))
        version = api.list_cluster_custom_object(*NI)["metadata"]["resourceVersion"]
        double.stop()
        double.start()
        kept = api.get_cluster_custom_object(*NI, "n1")
        assert kept["address"] == "a:1"
        assert api.list_cluster_custom_object(*NI)["metadata"]["resourceVersion"] == version
        api.create_cluster_custom_object(*NI, inventory("n2"))
        assert int(api.list_cluster_custom_object(*NI)["metadata"]["resourceVersion"]) > int(
            version
        )

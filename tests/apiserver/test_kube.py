"""The Kubernetes-style API over real HTTP, on a static in-memory fleet."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from sandboxctl.apiserver.kube import create_kube_app
from sandboxctl.core.watching import INITIAL_EVENTS_END
from sandboxctl.inventory.memory import MemoryInventorySource
from sandboxctl.store import Query, SandboxStore
from tests.apiserver.conftest import (
    ALL_SANDBOXES,
    FLEET,
    GROUP_PATH,
    SANDBOXES,
    TABLE,
    entry,
    inventory,
)
from tests.apiserver.helpers import AUTH, KUBE_TOKENS, serving, watch

NODE = "sandbox.cocoonstack.io/node"
PHASE = "sandbox.cocoonstack.io/phase"


def names(body: dict[str, Any]) -> list[str]:
    return [f"{i['metadata']['namespace']}/{i['metadata']['name']}" for i in body["items"]]


def assert_status(response: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    assert response.status_code == code, response.text
    body = response.json()
    assert body["kind"] == "Status"
    assert body["apiVersion"] == "v1"
    assert body["status"] == "Failure"
    assert body["code"] == code
    assert body["reason"] == reason
    return body  # type: ignore[no-any-return]


# --- discovery ------------------------------------------------------------------------------


def test_version_carries_every_version_info_field(client: httpx.Client) -> None:
    for path in ("/version", "/version/"):
        body = client.get(path).json()
        assert set(body) == {
            "major",
            "minor",
            "gitVersion",
            "gitCommit",
            "gitTreeState",
            "buildDate",
            "goVersion",
            "compiler",
            "platform",
        }
        assert (body["major"], body["minor"]) == ("1", "35")


def test_discovery_documents_have_the_legacy_shapes(client: httpx.Client) -> None:
    api = client.get("/api").json()
    assert api["kind"] == "APIVersions"
    assert api["versions"] == []  # no core resources: kubectl then never asks /api/v1
    assert api["serverAddressByClientCIDRs"]

    core = client.get("/api/v1").json()
    assert (core["kind"], core["groupVersion"], core["resources"]) == (
        "APIResourceList",
        "v1",
        [],
    )

    groups = client.get("/apis")
    assert groups.headers["content-type"] == "application/json"
    group_list = groups.json()
    assert group_list["kind"] == "APIGroupList"
    [group] = group_list["groups"]
    version = {"groupVersion": "agents.x-k8s.io/v1beta1", "version": "v1beta1"}
    assert group == {"name": "agents.x-k8s.io", "versions": [version], "preferredVersion": version}

    single = client.get("/apis/agents.x-k8s.io").json()
    assert single["kind"] == "APIGroup"
    assert single["preferredVersion"] == version

    resources = client.get(GROUP_PATH).json()
    assert resources["kind"] == "APIResourceList"
    assert resources["groupVersion"] == "agents.x-k8s.io/v1beta1"
    [sandboxes] = resources["resources"]
    assert sandboxes == {
        "name": "sandboxes",
        "singularName": "sandbox",
        "namespaced": True,
        "kind": "Sandbox",
        "verbs": ["create", "delete", "get", "list", "watch"],
        "shortNames": ["sbx"],
    }


def test_a_minimal_openapi_v3_lets_kubectl_leave_validation_to_the_server(
    client: httpx.Client,
) -> None:
    root = client.get("/openapi/v3").json()
    [(path, link)] = root["paths"].items()
    assert path == "apis/agents.x-k8s.io/v1beta1"
    document = client.get(link["serverRelativeURL"]).json()
    [operations] = document["paths"].values()
    patch = operations["patch"]
    assert patch["x-kubernetes-group-version-kind"]["kind"] == "Sandbox"
    assert [p["name"] for p in patch["parameters"]] == ["fieldValidation"]


@pytest.mark.parametrize(
    "path", ["/apis/example.com", "/apis/agents.x-k8s.io/v1", "/apis/example.com/v1", "/nope"]
)
def test_an_unknown_group_version_or_path_is_a_404_status(client: httpx.Client, path: str) -> None:
    body = assert_status(client.get(path), 404, "NotFound")
    assert body["message"] == "the server could not find the requested resource"


# --- list and get ---------------------------------------------------------------------------


def test_a_namespaced_list_holds_that_namespace_sorted(client: httpx.Client) -> None:
    response = client.get(SANDBOXES, params={"limit": "500"})
    body = response.json()
    assert (body["apiVersion"], body["kind"]) == ("agents.x-k8s.io/v1beta1", "SandboxList")
    assert body["metadata"]["resourceVersion"]
    assert names(body) == ["default/a1", "default/a2", "default/b1"]
    for item in body["items"]:
        assert (item["apiVersion"], item["kind"]) == ("agents.x-k8s.io/v1beta1", "Sandbox")
    assert "continue" not in body["metadata"]


def test_limit_and_continue_page_through_one_list(client: httpx.Client) -> None:
    first = client.get(SANDBOXES, params={"limit": "2"}).json()
    assert names(first) == ["default/a1", "default/a2"]
    token = first["metadata"]["continue"]
    rest = client.get(SANDBOXES, params={"limit": "2", "continue": token}).json()
    assert names(rest) == ["default/b1"]
    assert "continue" not in rest["metadata"]
    assert rest["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert_status(client.get(SANDBOXES, params={"limit": "many"}), 400, "BadRequest")


def test_bad_versions_and_continue_tokens_are_a_400_naming_the_field(
    client: httpx.Client,
) -> None:
    cases = [
        ({"resourceVersion": "abc"}, "resourceVersion"),
        ({"resourceVersion": "abc", "watch": "1"}, "resourceVersion"),
        ({"limit": "1", "continue": "x!"}, "continue"),
        ({"resourceVersion": "1", "resourceVersionMatch": "Bogus"}, "resourceVersionMatch"),
        ({"resourceVersionMatch": "Exact"}, "resourceVersionMatch"),
    ]
    for params, field in cases:
        body = assert_status(client.get(SANDBOXES, params=params), 400, "BadRequest")
        assert field in body["message"], params


def test_a_version_this_server_never_gave_is_410_expired(client: httpx.Client) -> None:
    listed = client.get(SANDBOXES).json()
    later = str(int(listed["metadata"]["resourceVersion"]) + 10**9)
    assert_status(client.get(SANDBOXES, params={"resourceVersion": later}), 410, "Expired")
    response = client.get(SANDBOXES, params={"watch": "1", "resourceVersion": later})
    assert response.status_code == 200
    (line,) = response.text.splitlines()
    event = json.loads(line)
    assert event["type"] == "ERROR"
    assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")


def test_an_all_namespaces_list_holds_every_namespace(client: httpx.Client) -> None:
    body = client.get(ALL_SANDBOXES).json()
    assert body["kind"] == "SandboxList"
    assert names(body) == ["default/a1", "default/a2", "default/b1", "team/t1"]


def test_an_empty_list_has_an_empty_items_array(client: httpx.Client) -> None:
    body = client.get(f"{GROUP_PATH}/namespaces/empty/sandboxes").json()
    assert body["items"] == []


def test_label_selectors_filter_on_the_synthesized_labels(client: httpx.Client) -> None:
    hibernated = client.get(ALL_SANDBOXES, params={"labelSelector": f"{PHASE}=Hibernated"})
    assert names(hibernated.json()) == ["default/a2"]
    on_n2 = client.get(ALL_SANDBOXES, params={"labelSelector": f"{NODE} in (n2)"})
    assert names(on_n2.json()) == ["default/b1", "team/t1"]
    running_n1 = client.get(SANDBOXES, params={"labelSelector": f"{NODE}=n1,{PHASE}!=Hibernated"})
    assert names(running_n1.json()) == ["default/a1"]


def test_field_selectors_filter_by_name_and_node(client: httpx.Client) -> None:
    by_name = client.get(SANDBOXES, params={"fieldSelector": "metadata.name=a2"})
    assert names(by_name.json()) == ["default/a2"]
    by_node = client.get(ALL_SANDBOXES, params={"fieldSelector": "status.nodeName=n2"})
    assert names(by_node.json()) == ["default/b1", "team/t1"]
    absent = client.get(SANDBOXES, params={"fieldSelector": "metadata.name=nope"})
    assert absent.json()["items"] == []


@pytest.mark.parametrize("path", [SANDBOXES, ALL_SANDBOXES])
def test_an_unsupported_field_selector_is_a_400_naming_the_field(
    client: httpx.Client, path: str
) -> None:
    for params in ({"fieldSelector": "spec.x=y"}, {"fieldSelector": "spec.x=y", "watch": "1"}):
        body = assert_status(client.get(path, params=params), 400, "BadRequest")
        assert "spec.x" in body["message"]
        assert "not supported" in body["message"]


def test_a_malformed_label_selector_is_a_400(client: httpx.Client) -> None:
    body = assert_status(
        client.get(SANDBOXES, params={"labelSelector": "a in (b"}), 400, "BadRequest"
    )
    assert "a in (b" in body["message"]


def test_get_answers_the_object(client: httpx.Client) -> None:
    body = client.get(f"{SANDBOXES}/a1").json()
    assert (body["apiVersion"], body["kind"]) == ("agents.x-k8s.io/v1beta1", "Sandbox")
    assert body["metadata"]["name"] == "a1"
    assert body["metadata"]["namespace"] == "default"
    assert body["metadata"]["labels"][NODE] == "n1"
    assert body["status"]["nodeName"] == "n1"


def test_get_of_a_missing_sandbox_is_a_404_status(client: httpx.Client) -> None:
    body = assert_status(client.get(f"{SANDBOXES}/nope"), 404, "NotFound")
    assert body["message"] == 'sandboxes.agents.x-k8s.io "nope" not found'
    assert body["details"] == {"name": "nope", "group": "agents.x-k8s.io", "kind": "sandboxes"}


# --- Table ----------------------------------------------------------------------------------


def test_lists_and_gets_answer_a_table_when_asked(client: httpx.Client) -> None:
    table = client.get(SANDBOXES, headers={"Accept": TABLE}).json()
    assert (table["apiVersion"], table["kind"]) == ("meta.k8s.io/v1", "Table")
    assert table["metadata"]["resourceVersion"]
    columns = table["columnDefinitions"]
    shown = [c["name"] for c in columns if c["priority"] == 0]
    assert shown == ["Name", "ID", "Node", "Phase", "Template", "Age"]
    wide = [c["name"] for c in columns if c["priority"] == 1]  # kubectl: only under -o wide
    assert wide == ["Expires In", "IP", "CPUs", "Memory"]
    assert all(set(c) == {"name", "type", "format", "description", "priority"} for c in columns)
    ip = "10.0.0.9"
    assert [row["cells"] for row in table["rows"]] == [  # the id as the SDK spells it
        ["a1", "sb-default-a1", "n1", "Running", "base", "60s", "5m", ip, "<none>", "<none>"],
        ["a2", "sb-default-a2", "n1", "Hibernated", "base", "5m10s", "5m", ip, "<none>", "<none>"],
        ["b1", "sb-default-b1", "n2", "Running", "python", "60s", "5m", ip, "<none>", "<none>"],
    ]
    row = table["rows"][0]["object"]
    assert (row["apiVersion"], row["kind"]) == ("meta.k8s.io/v1", "PartialObjectMetadata")
    assert row["metadata"]["labels"][NODE] == "n1"

    single = client.get(f"{SANDBOXES}/b1", headers={"Accept": TABLE}).json()
    assert single["kind"] == "Table"
    assert [row["cells"][0] for row in single["rows"]] == ["b1"]


def test_plain_json_is_answered_without_the_table_accept(client: httpx.Client) -> None:
    accept = "application/json;as=Table;v=v1;g=example.com, application/json"
    assert client.get(SANDBOXES, headers={"Accept": accept}).json()["kind"] == "SandboxList"


# --- watch ----------------------------------------------------------------------------------


def test_a_watch_list_opens_with_the_current_view_then_the_initial_events_bookmark(
    client: httpx.Client,
) -> None:
    params = {"sendInitialEvents": "true", "allowWatchBookmarks": "true"}
    params |= {"resourceVersionMatch": "NotOlderThan", "timeoutSeconds": "60"}
    with watch(client, SANDBOXES, **params) as events:
        opening = events.take(4)
    assert [e["type"] for e in opening] == ["ADDED", "ADDED", "ADDED", "BOOKMARK"]
    assert [e["object"]["metadata"]["name"] for e in opening[:3]] == ["a1", "a2", "b1"]
    bookmark = opening[3]["object"]
    assert (bookmark["apiVersion"], bookmark["kind"]) == ("agents.x-k8s.io/v1beta1", "Sandbox")
    assert bookmark["metadata"]["annotations"] == {INITIAL_EVENTS_END: "true"}
    assert bookmark["metadata"]["resourceVersion"]


def test_a_watch_reports_what_the_inventories_change(
    client: httpx.Client, source: MemoryInventorySource
) -> None:
    n1, n2 = FLEET
    version = client.get(SANDBOXES).json()["metadata"]["resourceVersion"]
    with watch(client, SANDBOXES, resourceVersion=version) as events:
        # from a list's version: only later changes, never the objects listed
        source.apply(inventory("n1", entry("default/a1", phase="Hibernated"), n1.entries[1]))
        modified = events.next()
        assert modified is not None
        assert modified["type"] == "MODIFIED"  # no BOOKMARK: it did not ask for one
        assert modified["object"]["metadata"]["labels"][PHASE] == "Hibernated"

        source.apply(inventory("n2", entry("default/b2"), *n2.entries))
        added = events.next()
        assert added is not None
        assert (added["type"], added["object"]["metadata"]["name"]) == ("ADDED", "b2")

        source.apply(inventory("n1", n1.entries[1]))
        deleted = events.next()
        assert deleted is not None
        assert deleted["type"] == "DELETED"
        assert deleted["object"]["metadata"]["name"] == "a1"
        assert deleted["object"]["metadata"]["labels"][PHASE] == "Hibernated"  # last state


def test_an_inventory_change_wakes_an_open_watch_without_its_tick(
    store: SandboxStore, source: MemoryInventorySource
) -> None:
    # The tick is an hour: only the source's notification can bring the event in time.
    app = create_kube_app(store, KUBE_TOKENS, watch_interval=3600)
    with (
        serving(app) as url,
        httpx.Client(base_url=url, headers=AUTH, timeout=10) as http,
        watch(http, SANDBOXES, resourceVersion=store.list(Query()).version) as events,
    ):
        started = time.monotonic()
        source.apply(inventory("n2", entry("default/b2"), *FLEET[1].entries))
        added = events.next(timeout=5)
        assert added is not None
        assert (added["type"], added["object"]["metadata"]["name"]) == ("ADDED", "b2")
        assert time.monotonic() - started < 5


def test_a_pinned_watch_follows_one_name(
    client: httpx.Client, source: MemoryInventorySource
) -> None:
    n1, _ = FLEET
    with watch(
        client, SANDBOXES, fieldSelector="metadata.name=a1", sendInitialEvents="1"
    ) as events:
        assert [e["type"] for e in events.take(2)] == ["ADDED", "BOOKMARK"]
        source.apply(inventory("n1", n1.entries[1]))  # a1 released
        deleted = events.next()
        assert deleted is not None
        assert (deleted["type"], deleted["object"]["metadata"]["name"]) == ("DELETED", "a1")


def test_a_watch_answers_table_events_when_asked(
    client: httpx.Client, source: MemoryInventorySource
) -> None:
    _, n2 = FLEET
    with watch(client, ALL_SANDBOXES, headers={"Accept": TABLE}) as events:
        first = events.take(4)
        assert {e["object"]["kind"] for e in first} == {"Table"}
        assert first[0]["object"]["rows"][0]["cells"][:3] == ["a1", "sb-default-a1", "n1"]
        source.apply(inventory("n2", *n2.entries, entry("zz/z1")))
        added = events.next()
        assert added is not None
        assert added["type"] == "ADDED"
        assert added["object"]["rows"][0]["cells"][0] == "z1"
        assert added["object"]["rows"][0]["object"]["metadata"]["namespace"] == "zz"


def test_a_watch_ends_at_its_timeout(client: httpx.Client) -> None:
    with watch(client, SANDBOXES, timeoutSeconds="1") as events:
        assert len(events.take(3)) == 3
        assert events.next(timeout=10) is None


def test_bad_watch_parameters_are_a_400(client: httpx.Client) -> None:
    assert_status(client.get(SANDBOXES, params={"watch": "maybe"}), 400, "BadRequest")
    params = {"watch": "1", "timeoutSeconds": "-1"}
    assert_status(client.get(SANDBOXES, params=params), 400, "BadRequest")


# --- writes without claim routing -----------------------------------------------------------

SANDBOX = {
    "apiVersion": "agents.x-k8s.io/v1beta1",
    "kind": "Sandbox",
    "metadata": {"name": "new"},
    "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "base"}]}}},
}


def test_create_without_node_access_is_a_503(client: httpx.Client) -> None:
    body = assert_status(client.post(SANDBOXES, json=SANDBOX), 503, "ServiceUnavailable")
    assert "token" in body["message"]


def test_create_refuses_dry_run_and_bad_objects(client: httpx.Client) -> None:
    assert_status(client.post(SANDBOXES, params={"dryRun": "All"}, json=SANDBOX), 400, "BadRequest")
    no_image = {**SANDBOX, "spec": {}}
    body = assert_status(client.post(SANDBOXES, json=no_image), 422, "Invalid")
    assert "containers" in body["message"]
    past = {**SANDBOX, "spec": {**SANDBOX["spec"], "shutdownTime": "2020-01-01T00:00:00Z"}}  # type: ignore[dict-item]
    body = assert_status(client.post(SANDBOXES, json=past), 400, "BadRequest")
    assert "shutdownTime" in body["message"]
    assert_status(client.post(SANDBOXES, content=b"{not json"), 400, "BadRequest")
    other_ns = {**SANDBOX, "metadata": {"name": "x", "namespace": "team"}}
    assert_status(client.post(SANDBOXES, json=other_ns), 400, "BadRequest")


def test_delete_of_a_missing_sandbox_is_a_404_and_dry_run_a_400(client: httpx.Client) -> None:
    assert_status(client.delete(f"{SANDBOXES}/nope"), 404, "NotFound")
    dry = client.request("DELETE", f"{SANDBOXES}/a1", json={"dryRun": ["All"]})
    assert_status(dry, 400, "BadRequest")


def test_update_and_patch_are_not_allowed(client: httpx.Client) -> None:
    assert_status(client.put(f"{SANDBOXES}/a1", json=SANDBOX), 405, "MethodNotAllowed")
    assert_status(client.patch(f"{SANDBOXES}/a1", json={}), 405, "MethodNotAllowed")


def test_every_response_names_its_api_version_and_kind(client: httpx.Client) -> None:
    # /version and /openapi/v3 are the exceptions, as on a real API server: not objects.
    requests = [
        ("GET", "/api", {}),
        ("GET", "/api/v1", {}),
        ("GET", "/apis", {}),
        ("GET", "/apis/agents.x-k8s.io", {}),
        ("GET", GROUP_PATH, {}),
        ("GET", SANDBOXES, {}),
        ("GET", SANDBOXES, {"headers": {"Accept": TABLE}}),
        ("GET", ALL_SANDBOXES, {}),
        ("GET", f"{SANDBOXES}/a1", {}),
        ("GET", f"{SANDBOXES}/a1", {"headers": {"Accept": TABLE}}),
        ("GET", f"{SANDBOXES}/nope", {}),
        ("GET", SANDBOXES, {"params": {"fieldSelector": "spec.x=y"}}),
        ("GET", "/apis/nope/v1", {}),
        ("POST", SANDBOXES, {"json": SANDBOX}),
        ("DELETE", f"{SANDBOXES}/nope", {}),
        ("PUT", f"{SANDBOXES}/a1", {"json": SANDBOX}),
    ]
    for method, path, kwargs in requests:
        body = client.request(method, path, **kwargs).json()
        assert body.get("apiVersion"), (method, path, body)
        assert body.get("kind"), (method, path, body)

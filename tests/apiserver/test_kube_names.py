"""The Sandbox API names things as the e2b API does: a template by the same rule (aliases
first), a sandbox by the SDK's id, a refused object by its name; and it describes its
fields in the OpenAPI v3 document ``kubectl explain`` reads.

In process, over real HTTP, on an in-memory fleet serving ``default`` only (as ``serve``
does) whose aliases point ``base`` at it; without node access, so a create that resolved
its template goes on to the claim and answers 503 (no fleet token). The pinned kubectl
and the SDK against a real ``serve`` are tests/fleet/test_kube_and_e2b.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kubernetes.client import ApiClient, Configuration, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from sandboxctl.apiserver.e2b import E2bConfig, create_e2b_app
from sandboxctl.apiserver.kube import create_kube_app
from sandboxctl.clock import ManualClock
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.model import NodeInventory, Pool, PoolKey
from sandboxctl.inventory.memory import MemoryInventorySource
from sandboxctl.store import SandboxStore
from tests.apiserver.conftest import GROUP_PATH, SANDBOXES, T0, entry
from tests.apiserver.helpers import AUTH, KUBE_TOKEN, KUBE_TOKENS, serving

KEY = "e2b_test_key"
# What serve gives both APIs: the e2b aliases, pointed at its template (fleet/template.py).
ALIASES = {"base": ("default", "small"), "code-interpreter-v1": ("default", "small")}
FLEET = (
    NodeInventory(
        node="n1",
        address="n1.invalid:7777",
        pools=(Pool(PoolKey("default"), warm=1, target=1),),
        entries=(entry("default/a1", template="default"),),
    ),
)


def web(image: str = "base", **metadata: Any) -> dict[str, Any]:
    """docs/api.md's web.yaml, as kubectl sends it."""
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": metadata or {"name": "web"},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": image}]}}},
    }


@pytest.fixture
def store() -> SandboxStore:
    clock = ManualClock(T0)
    return SandboxStore(MemoryInventorySource(FLEET, clock=clock), FreshnessRule(), clock=clock)


@pytest.fixture
def kube(store: SandboxStore) -> Iterator[httpx.Client]:
    app = create_kube_app(store, KUBE_TOKENS, aliases=ALIASES)
    with serving(app) as url, httpx.Client(base_url=url, headers=AUTH, timeout=10) as http:
        yield http


@pytest.fixture
def plain(store: SandboxStore) -> Iterator[httpx.Client]:
    """The Sandbox API with its default aliases, for what does not depend on them."""
    with (
        serving(create_kube_app(store, KUBE_TOKENS)) as url,
        httpx.Client(base_url=url, headers=AUTH, timeout=10) as http,
    ):
        yield http


@pytest.fixture
def e2b(store: SandboxStore) -> Iterator[httpx.Client]:
    config = E2bConfig(
        domain="sandboxctl.test", envd_secret=b"s" * 32, api_keys={KEY: "default"}, aliases=ALIASES
    )
    app = create_e2b_app(store, config)
    headers = {"X-API-Key": KEY}
    with serving(app) as url, httpx.Client(base_url=url, headers=headers, timeout=10) as http:
        yield http


# --- one reading of a template name -------------------------------------------------------


@pytest.mark.parametrize("name", ["base", "code-interpreter-v1", "default"])
def test_both_apis_take_an_alias_or_a_served_template_to_the_claim(
    kube: httpx.Client, e2b: httpx.Client, name: str
) -> None:
    created = kube.post(SANDBOXES, json=web(name))
    assert created.status_code == 503, created.text  # resolved: the claim needs a fleet token
    assert "token" in created.json()["message"]
    assert e2b.post("/sandboxes", json={"templateID": name}).status_code == 503


def test_both_apis_refuse_a_template_nothing_serves(kube: httpx.Client, e2b: httpx.Client) -> None:
    refused = kube.post(SANDBOXES, json=web("nosuch"))
    assert refused.status_code == 422, refused.text
    assert 'Not found: "nosuch"' in refused.json()["message"]
    assert e2b.post("/sandboxes", json={"templateID": "nosuch"}).status_code == 404


def test_an_alias_of_a_template_nothing_serves_says_which(store: SandboxStore) -> None:
    app = create_kube_app(store, KUBE_TOKENS, aliases={"base": ("gone", "small")})
    with serving(app) as url, httpx.Client(base_url=url, headers=AUTH) as http:
        refused = http.post(SANDBOXES, json=web("base"))
    assert refused.status_code == 422, refused.text
    [cause] = refused.json()["details"]["causes"]
    assert cause["message"] == 'Not found: "base": no node serves the alias of template "gone"'


# --- every refusal names its object -------------------------------------------------------


def test_a_refused_create_names_the_object_in_its_details_and_message(
    plain: httpx.Client,
) -> None:
    refused = plain.post(SANDBOXES, json=web("nosuch"))
    body = refused.json()
    assert body["details"]["name"] == "web"  # kubectl: The sandboxes "web" is invalid
    assert (body["details"]["kind"], body["details"]["group"]) == ("sandboxes", "agents.x-k8s.io")
    assert body["message"].startswith('Sandbox "web" is invalid: spec.podTemplate')

    no_container = {**web(), "spec": {}}
    assert plain.post(SANDBOXES, json=no_container).json()["details"]["name"] == "web"

    past = web()
    past["spec"]["shutdownTime"] = "2020-01-01T00:00:00Z"
    bad = plain.post(SANDBOXES, json=past).json()
    assert (bad["code"], bad["details"]["name"]) == (400, "web")
    assert bad["message"].startswith('Sandbox "web": spec.shutdownTime')


def test_dry_run_is_refused_naming_the_object(plain: httpx.Client) -> None:
    created = plain.post(SANDBOXES, params={"dryRun": "All"}, json=web()).json()
    assert (created["code"], created["details"]["name"]) == (400, "web")
    deleted = plain.delete(f"{SANDBOXES}/a1", params={"dryRun": "All"}).json()
    assert (deleted["code"], deleted["details"]["name"]) == (400, "a1")


def test_the_kubernetes_client_gets_by_id_and_reads_a_named_refusal(store: SandboxStore) -> None:
    """The official Python client, as a user's program calls it."""
    with serving(create_kube_app(store, KUBE_TOKENS)) as url:
        configuration = Configuration(host=url, api_key={"authorization": f"Bearer {KUBE_TOKEN}"})
        with ApiClient(configuration) as client:
            api = CustomObjectsApi(client)
            where = ("agents.x-k8s.io", "v1beta1", "default", "sandboxes")
            obj = api.get_namespaced_custom_object(*where, "sb-default-a1")
            assert obj["metadata"]["name"] == "a1"
            with pytest.raises(ApiException) as raised:
                api.create_namespaced_custom_object(*where, web("nosuch"))
            client.rest_client.pool_manager.clear()  # its kept-alive connections: the server stops
    assert raised.value.status == 422
    status = json.loads(raised.value.body)
    assert status["details"]["name"] == "web"


def test_a_refused_generate_name_says_it_was_one(plain: httpx.Client) -> None:
    body = plain.post(SANDBOXES, json=web("nosuch", generateName="web-")).json()
    assert body["details"]["name"] == "generateName web-"
    assert body["message"].startswith('Sandbox "generateName web-" is invalid')


# --- a sandbox by the SDK's id ------------------------------------------------------------


@pytest.mark.parametrize("spelled", ["sb-default-a1", "sb_default_a1"])
def test_get_finds_a_sandbox_by_its_id_in_either_spelling(
    plain: httpx.Client, spelled: str
) -> None:
    got = plain.get(f"{SANDBOXES}/{spelled}")
    assert got.status_code == 200, got.text
    obj = got.json()
    assert obj["metadata"]["name"] == "a1"
    assert obj["metadata"]["annotations"]["sandbox.cocoonstack.io/claim-id"] == "sb-default-a1"
    other_namespace = plain.get(f"{GROUP_PATH}/namespaces/team/sandboxes/{spelled}")
    assert other_namespace.status_code == 404


# --- OpenAPI for kubectl explain ----------------------------------------------------------


def _described(schema: dict[str, Any], path: str) -> list[str]:
    """The dotted paths under ``schema`` that have no description."""
    missing = [] if schema.get("description") else [path]
    for name, field in (schema.get("properties") or {}).items():
        missing += _described(field, f"{path}.{name}")
    if "items" in schema:
        missing += _described(schema["items"], f"{path}[]")
    return missing


def test_the_openapi_v3_schema_describes_every_field(plain: httpx.Client) -> None:
    [link] = plain.get("/openapi/v3").json()["paths"].values()
    document = plain.get(link["serverRelativeURL"]).json()
    [schema] = document["components"]["schemas"].values()
    assert schema["x-kubernetes-group-version-kind"] == [
        {"group": "agents.x-k8s.io", "version": "v1beta1", "kind": "Sandbox"}
    ]
    assert set(schema["properties"]) == {"apiVersion", "kind", "metadata", "spec", "status"}
    spec = schema["properties"]["spec"]
    assert set(spec["properties"]) == {"podTemplate", "shutdownTime"}
    assert _described(schema, "sandbox") == []

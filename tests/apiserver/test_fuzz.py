"""A bounded fuzz pass, Sandbox API side: hypothesis makes
Sandbox bodies (any JSON, and Sandbox-shaped objects with wild fields), namespaces and
names (any text, control characters included), and no answer may be a 5xx but the
documented 502 (a node did not answer) and 503 (no capacity).

As in tests/apiserver/e2b/test_fuzz.py the fleet's node answers nothing, so the API's own reading
and checks are what is fuzzed. A few hundred requests, in seconds."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandboxctl.apiserver import create_kube_app
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.model import Entry, NodeInventory, Pool, PoolKey
from sandboxctl.inventory.memory import MemoryInventorySource
from sandboxctl.store import SandboxStore
from sandboxctl.store.nodes import NodeAccess
from tests.apiserver.conftest import GROUP_PATH
from tests.apiserver.helpers import AUTH, KUBE_TOKENS, serving
from tests.sandboxd.servers import free_port

ALLOWED_5XX = {502, 503}
FUZZ = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
names = st.text(max_size=80) | st.sampled_from(["s1", "a" * 300, "UPPER", "-x", "a.b", ""])
strings = st.text(max_size=40) | st.sampled_from(["base", "none", "egress", "10m", "2Gi"])
string_maps = st.dictionaries(strings, strings, max_size=4) | json_values
containers = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "name": strings,
            "image": strings | json_values,
            "resources": st.fixed_dictionaries(
                {}, optional={"requests": string_maps, "limits": string_maps}
            )
            | json_values,
        },
    )
    | json_values,
    max_size=2,
)
sandboxes = st.fixed_dictionaries(
    {},
    optional={
        "apiVersion": st.sampled_from(["agents.x-k8s.io/v1beta1", "v1"]) | json_values,
        "kind": st.sampled_from(["Sandbox", "Pod"]) | json_values,
        "metadata": st.fixed_dictionaries(
            {},
            optional={
                "name": names | json_values,
                "generateName": names | json_values,
                "namespace": names | json_values,
                "labels": string_maps,
                "annotations": string_maps,
            },
        )
        | json_values,
        "spec": st.fixed_dictionaries(
            {},
            optional={
                "shutdownTime": strings | json_values,
                "podTemplate": st.fixed_dictionaries(
                    {},
                    optional={
                        "metadata": st.fixed_dictionaries(
                            {}, optional={"annotations": string_maps}
                        ),
                        "spec": st.fixed_dictionaries({}, optional={"containers": containers}),
                    },
                )
                | json_values,
            },
        )
        | json_values,
    },
)


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    now = datetime.now(UTC)
    nowhere = f"127.0.0.1:{free_port()}"  # nothing listens: every node call fails at once
    entry = Entry(
        name="default/s1",
        phase="Running",
        id="sb_000000000001",
        template="base",
        claim_ref="default/s1",
        addr=nowhere,
        deadline=now + timedelta(hours=1),
        claimed_at=now,
    )
    inventory = NodeInventory(
        node="n1",
        address=nowhere,
        pools=(Pool(PoolKey("base"), warm=2, target=2),),
        entries=(entry,),
        published_at=now,
    )
    store = SandboxStore(
        MemoryInventorySource((inventory,)), FreshnessRule(), nodes=NodeAccess("fleet-token")
    )
    with (
        serving(create_kube_app(store, KUBE_TOKENS)) as url,
        httpx.Client(base_url=url, headers=AUTH, timeout=10) as client,
    ):
        yield client


def _documented(response: httpx.Response) -> None:
    status = response.status_code
    assert status < 500 or status in ALLOWED_5XX, (status, response.text[:300])
    if status >= 400:
        assert response.json()["kind"] == "Status", response.text[:300]


@FUZZ
@given(namespace=names, body=sandboxes | json_values)
def test_creates_of_any_body_answer_no_undocumented_5xx(
    http: httpx.Client, namespace: str, body: Any
) -> None:
    path = f"{GROUP_PATH}/namespaces/{quote(namespace, safe='')}/sandboxes"
    _documented(http.post(path, json=body))


@FUZZ
@given(namespace=names, name=names, method=st.sampled_from(["GET", "DELETE"]))
def test_any_namespace_and_name_answer_no_undocumented_5xx(
    http: httpx.Client, namespace: str, name: str, method: str
) -> None:
    path = f"{GROUP_PATH}/namespaces/{quote(namespace, safe='')}/sandboxes/{quote(name, safe='')}"
    _documented(http.request(method, path))


@FUZZ
@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_bytes_as_a_body_answer_no_undocumented_5xx(http: httpx.Client, raw: bytes) -> None:
    path = f"{GROUP_PATH}/namespaces/default/sandboxes"
    _documented(http.post(path, content=raw, headers={"content-type": "application/json"}))


def test_json_constants_outside_the_standard_are_400(http: httpx.Client) -> None:
    """Python's reader takes NaN and Infinity, which no answer could carry back."""
    body = (
        b'{"metadata": {"name": "s1"}, "spec": {"x": Infinity, "podTemplate": {"spec": '
        b'{"containers": [{"image": "base"}]}}}}'
    )
    response = http.post(f"{GROUP_PATH}/namespaces/default/sandboxes", content=body)
    assert response.status_code == 400, response.text

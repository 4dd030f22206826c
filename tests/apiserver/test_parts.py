"""The pure parts of the API server: create inputs, Table ages, Status mapping, kubeconfig."""

from __future__ import annotations

import stat
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandboxctl.apiserver.creation import create_request, parse_quantity
from sandboxctl.apiserver.kubeconfig import server_url, write_kubeconfig
from sandboxctl.apiserver.status import ApiError, api_error
from sandboxctl.apiserver.tables import human_duration, wants_table
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.model import PoolKey
from sandboxctl.core.placement import NoWarmCapacity
from sandboxctl.store.errors import ClaimRoutingOff, NodeRefused, NodeUnavailable, NotFound

NOW = datetime(2026, 11, 30, 4, 0, tzinfo=UTC)


def sandbox(
    annotations: dict[str, str] | None = None,
    resources: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "python"}
    if resources is not None:
        container["resources"] = resources
    return {
        "metadata": {"name": "s1", "annotations": annotations or {}},
        "spec": {"podTemplate": {"spec": {"containers": [container]}}, **spec},
    }


# --- create inputs --------------------------------------------------------------------------


def test_the_pool_key_comes_from_the_first_container_and_the_net_annotation() -> None:
    request = create_request("team", sandbox(), NOW)
    assert (request.namespace, request.name) == ("team", "s1")
    assert request.key == PoolKey("python", "none", "small")
    assert request.ttl_seconds == 0

    egress = sandbox({"sandbox.cocoonstack.io/net": "egress"})
    assert create_request("team", egress, NOW).key.net == "egress"

    on_pod = sandbox()
    on_pod["spec"]["podTemplate"]["metadata"] = {
        "annotations": {"sandbox.cocoonstack.io/net": "egress"}
    }
    assert create_request("team", on_pod, NOW).key.net == "egress"


@pytest.mark.parametrize(
    ("resources", "size"),
    [
        ({}, "small"),
        ({"requests": {"cpu": "1", "memory": "2Gi"}}, "small"),
        ({"requests": {"cpu": "1500m"}}, "medium"),
        ({"requests": {"memory": "2049Mi"}}, "medium"),
        ({"requests": {"cpu": 4, "memory": "8Gi"}}, "medium"),
        ({"requests": {"cpu": "4.5"}}, "large"),
        ({"requests": {"memory": "9G"}}, "large"),
        ({"limits": {"cpu": "8"}}, "large"),
        ({"requests": {"cpu": "500m"}, "limits": {"cpu": "8"}}, "small"),  # requests win
    ],
)
def test_the_size_follows_requests_then_limits(resources: dict[str, Any], size: str) -> None:
    assert create_request("d", sandbox(resources=resources), NOW).key.size == size


def test_quantities_parse_like_kubernetes() -> None:
    assert parse_quantity("500m") == Decimal("0.5")
    assert parse_quantity("2Gi") == 2 * 2**30
    assert parse_quantity("1e3") == 1000
    assert parse_quantity("1E") == 10**18
    assert parse_quantity(".5") == Decimal("0.5")
    with pytest.raises(InvalidValueError):
        parse_quantity("two")


def test_shutdown_time_wins_over_the_ttl_annotation_and_rounds_up() -> None:
    ttl = {"sandbox.cocoonstack.io/ttl-seconds": "600"}
    assert create_request("d", sandbox(ttl), NOW).ttl_seconds == 600
    later = (NOW + timedelta(seconds=90, milliseconds=200)).isoformat()
    assert create_request("d", sandbox(ttl, shutdownTime=later), NOW).ttl_seconds == 91


@pytest.mark.parametrize(
    ("body", "code", "words"),
    [
        (sandbox(shutdownTime="2026-11-30T04:00:00Z"), 400, "not in the future"),
        (sandbox(shutdownTime="tomorrow"), 400, "spec.shutdownTime"),
        (sandbox({"sandbox.cocoonstack.io/ttl-seconds": "5m"}), 400, "ttl-seconds"),
        (sandbox(resources={"requests": {"cpu": "lots"}}), 422, "cpu"),
        ({"metadata": {"name": "x"}}, 422, "containers"),
        ({**sandbox(), "metadata": {}}, 422, "name or generateName is required"),
        ({**sandbox(), "metadata": {"name": "Bad_Name"}}, 422, "RFC 1123"),
        ({**sandbox(), "kind": "Pod"}, 400, "kind"),
        ([], 400, "Sandbox object"),
    ],
)
def test_bad_create_inputs_name_what_is_wrong(body: Any, code: int, words: str) -> None:
    with pytest.raises(ApiError) as raised:
        create_request("d", body, NOW)
    assert raised.value.code == code
    assert words in raised.value.message


def test_generate_name_gets_a_random_suffix() -> None:
    body = {**sandbox(), "metadata": {"generateName": "job-"}}
    first, second = (create_request("d", body, NOW).name for _ in range(2))
    assert first.startswith("job-")
    assert len(first) == len("job-") + 5
    assert first != second


# --- Table ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-5, "<invalid>"),
        (0, "0s"),
        (119, "119s"),
        (310, "5m10s"),
        (600, "10m"),
        (3 * 3600 + 60, "3h1m"),
        (8 * 3600, "8h"),
        (50 * 3600, "2d2h"),
        (9 * 86400, "9d"),
        (800 * 86400, "2y70d"),
    ],
)
def test_ages_read_like_kubectl(seconds: int, text: str) -> None:
    assert human_duration(timedelta(seconds=seconds)) == text


def test_only_a_meta_v1_table_accept_asks_for_a_table() -> None:
    assert wants_table("application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
    assert wants_table("application/json; as=Table; g=meta.k8s.io; v=v1")
    assert not wants_table("application/json")
    assert not wants_table("application/json;as=Table;v=v1beta1;g=meta.k8s.io")


# --- Status mapping -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "code", "reason"),
    [
        (NotFound('sandboxes "x"'), 404, "NotFound"),
        (InvalidValueError("bad selector"), 400, "BadRequest"),
        (NodeRefused(409, "already claimed"), 409, "Conflict"),
        (NodeRefused(429, "at capacity"), 429, "TooManyRequests"),
        (NoWarmCapacity(), 503, "ServiceUnavailable"),
        (ClaimRoutingOff("no token"), 503, "ServiceUnavailable"),
        (NodeUnavailable("timed out"), 502, "InternalError"),
        (RuntimeError("bug"), 500, "InternalError"),
    ],
)
def test_every_store_error_has_a_status(error: Exception, code: int, reason: str) -> None:
    status = api_error(error).body()
    assert (status["code"], status["reason"]) == (code, reason)
    assert (status["kind"], status["apiVersion"], status["status"]) == ("Status", "v1", "Failure")


# --- kubeconfig -----------------------------------------------------------------------------


def test_the_kubeconfig_points_at_the_server_and_is_private(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("old")
    path.chmod(0o644)
    write_kubeconfig(path, "http://127.0.0.1:3002", "t0ken")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    config = yaml.safe_load(path.read_text())
    assert config["current-context"] == "sandboxctl"
    assert config["clusters"] == [
        {"name": "sandboxctl", "cluster": {"server": "http://127.0.0.1:3002"}}
    ]
    assert config["users"] == [{"name": "sandboxctl", "user": {"token": "t0ken"}}]
    [context] = config["contexts"]
    assert context["context"] == {
        "cluster": "sandboxctl",
        "user": "sandboxctl",
        "namespace": "default",
    }
    assert [p.name for p in tmp_path.iterdir()] == ["kubeconfig"]  # no scratch file left


def test_a_wildcard_listen_address_is_reached_on_loopback() -> None:
    assert server_url("0.0.0.0", 3002) == "http://127.0.0.1:3002"
    assert server_url("::", 3002) == "http://[::1]:3002"
    assert server_url("10.1.2.3", 80) == "http://10.1.2.3:80"

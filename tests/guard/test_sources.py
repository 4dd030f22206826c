"""The busy sources: what each reads as busy, idle or unknown, and the flag that picks one."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from kubernetes import client

from sandboxctl.core.errors import ConfigurationError, InvalidValueError
from sandboxctl.guard.busy import AnnotationSource
from sandboxctl.guard.decide import Busy
from sandboxctl.guard.hosts import SandboxHostsSource
from sandboxctl.guard.pods import pod_view
from sandboxctl.guard.probe import ProbeSource, check_template
from sandboxctl.guard.sessions import SessionsAnswerError, read_counts
from sandboxctl.guard.sources import BusySpec, SourceKind, parse_busy_source
from tests.guard.endpoints import WorkerEndpoints
from tests.guard.realcluster import RealCluster
from tests.sandboxd.servers import wait_until

INVENTORIES = ("sandbox.cocoonstack.io", "v1beta1", "nodeinventories")


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("sessions=http://cp:8/sessions", BusySpec(SourceKind.SESSIONS, "http://cp:8/sessions")),
        ("probe=http://{ip}:8080/busy", BusySpec(SourceKind.PROBE, "http://{ip}:8080/busy")),
        ("annotation=example.com/busy", BusySpec(SourceKind.ANNOTATION, "example.com/busy")),
        ("sandbox-hosts", BusySpec(SourceKind.SANDBOX_HOSTS)),
    ],
)  # fmt: skip
def test_the_busy_source_flag(text: str, spec: BusySpec) -> None:
    assert parse_busy_source(text) == spec


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("redis=x", "expected sessions=URL"),
        ("sessions=", "the value is missing"),
        ("sessions=cp:8080", "expected an http(s) URL"),
        ("probe=http://{address}/busy", "unknown placeholder {address}"),
        ("probe=http://{}/busy", "unknown placeholder {}"),
        ("sandbox-hosts=yes", "takes no value"),
    ],
)
def test_a_bad_busy_source_is_one_clear_line(text: str, problem: str) -> None:
    with pytest.raises((InvalidValueError, ConfigurationError)) as error:
        parse_busy_source(text)
    assert problem in str(error.value)
    assert "\n" not in str(error.value)


def test_sessions_answers() -> None:
    assert read_counts({"a": 2, "b": 0, "c": True, "d": -1}) == {"a": 2, "b": 0, "c": 1, "d": 0}
    for bad in ([1, 2], {"a": "2"}, {"a": 1.5}, "x"):
        with pytest.raises(SessionsAnswerError):
            read_counts(bad)


@pytest.mark.parametrize(
    ("value", "busy"),
    [
        (None, Busy.IDLE),
        ("0", Busy.IDLE),
        ("3", Busy.BUSY),
        ("true", Busy.BUSY),
        ("Busy", Busy.BUSY),
        ("false", Busy.IDLE),
        ("idle", Busy.IDLE),
        ("-1", Busy.IDLE),
        ("lots", Busy.UNKNOWN),
    ],
)
def test_workers_reporting_on_their_own_pod(value: str | None, busy: Busy) -> None:
    annotations = {"example.com/sessions": value} if value is not None else {}
    view = pod_view({"metadata": {"name": "w", "annotations": annotations}})
    assert AnnotationSource("example.com/sessions").reading(view) is busy


@pytest.mark.services  # a probe server on loopback
def test_a_probe_needs_a_pod_address_before_it_counts() -> None:
    check_template("http://{ip}:8080/busy?pod={namespace}/{name}")
    with pytest.raises(ConfigurationError, match="http"):
        check_template("{ip}:8080")
    endpoints = WorkerEndpoints()
    no_ip = pod_view({"metadata": {"name": "w", "uid": "u"}, "status": {"podIP": ""}})
    probe = ProbeSource("http://{ip}:1/busy", lambda: [no_ip], interval=1, timeout=1,
                        threshold=1, slack=timedelta(0))  # fmt: skip
    try:
        probe.probe_round()
        assert probe.reading(no_ip) is Busy.UNKNOWN  # not probed, not failed either
        assert probe.verdict("u").__class__.__name__ == "Healthy"
    finally:
        probe.stop()
        endpoints.close()


def inventory(node: str, claims: int) -> dict[str, Any]:
    return {
        "metadata": {"name": node},
        "node": node,
        "address": "10.0.0.1:7777",
        "entries": [{"name": f"default/s{i}", "phase": "Running"} for i in range(claims)],
    }


def test_sandbox_hosts_read_claims_from_the_node_inventory(real_cluster: RealCluster) -> None:
    custom = client.CustomObjectsApi(real_cluster.kube.api)
    for node, claims in (("node-a", 2), ("node-b", 0)):
        body = {"apiVersion": "sandbox.cocoonstack.io/v1beta1", "kind": "NodeInventory",
                **inventory(node, claims)}  # fmt: skip
        custom.create_cluster_custom_object(*INVENTORIES, body)
    changes: list[int] = []
    source = SandboxHostsSource(real_cluster.kube.api, watch_seconds=30)
    source.start(lambda: changes.append(1))
    try:
        assert source.wait_synced(10)
        on_a = pod_view({"metadata": {"name": "a", "uid": "1"}, "spec": {"nodeName": "node-a"}})
        on_b = pod_view({"metadata": {"name": "b", "uid": "2"}, "spec": {"nodeName": "node-b"}})
        nowhere = pod_view({"metadata": {"name": "c", "uid": "3"}})
        assert [source.reading(p) for p in (on_a, on_b, nowhere)] == [
            Busy.BUSY,
            Busy.IDLE,
            Busy.IDLE,
        ]
        assert source.detail(on_a) == "2 claimed sandboxes on node-a"
        released = {"entries": []}
        custom.patch_cluster_custom_object(*INVENTORIES, "node-a", released)
        wait_until(lambda: source.reading(on_a) is Busy.IDLE, what="node-a released")
        assert changes  # the reconciler is told at once
    finally:
        source.stop()

"""The Sandbox API's bounds: bodies are capped (413),
names, namespaces, labels and annotations are checked as Kubernetes checks them (422 naming
the field), an unknown template or network is 422, and a client's mistake (a deep body, a
control character in a name, a hang-up mid-body) is a 4xx or one log line, never a 500
or a traceback."""

from __future__ import annotations

import copy
import logging
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import pytest

from sandboxctl.apiserver.kube import MAX_BODY_BYTES
from tests.apiserver.conftest import SANDBOXES
from tests.apiserver.helpers import AUTH
from tests.sandboxd.servers import wait_until

SANDBOX: dict[str, Any] = {
    "apiVersion": "agents.x-k8s.io/v1beta1",
    "kind": "Sandbox",
    "metadata": {"name": "s1"},
    "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "base"}]}}},
}
NET = "sandbox.cocoonstack.io/net"


def sandbox(**metadata: Any) -> dict[str, Any]:
    body = copy.deepcopy(SANDBOX)
    body["metadata"].update(metadata)
    return body


def causes(reply: httpx.Response) -> list[str]:
    status = reply.json()
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 422, "Invalid")
    return [cause["field"] for cause in status["details"]["causes"]]


def test_a_body_over_the_cap_is_413_announced_or_streamed(client: httpx.Client) -> None:
    big = b"x" * (MAX_BODY_BYTES + 1)
    announced = client.post(SANDBOXES, content=big, headers={"content-type": "application/json"})

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        for _ in range(5):
            yield b" " * (1 << 20)

    streamed = client.post(SANDBOXES, content=chunks())
    for reply in (announced, streamed):
        assert reply.status_code == 413
        status = reply.json()
        assert (status["kind"], status["reason"]) == ("Status", "RequestEntityTooLarge")


def test_a_namespace_is_a_kubernetes_namespace_name(client: httpx.Client) -> None:
    long = "n" * 10_000
    reply = client.post(
        f"/apis/agents.x-k8s.io/v1beta1/namespaces/{long}/sandboxes", json=sandbox()
    )
    assert reply.status_code == 422
    assert causes(reply) == ["metadata.namespace"]
    assert len(reply.text) < 2000  # the bad value is not echoed whole


@pytest.mark.parametrize(
    ("metadata", "field"),
    [
        ({"name": "x" * 254}, "metadata.name"),
        ({"name": "Upper"}, "metadata.name"),
        ({"annotations": {"big": "v" * 900_000}}, "metadata.annotations"),
        ({"annotations": {"bad key!": "v"}}, "metadata.annotations"),
        ({"labels": {"team": "x" * 64}}, "metadata.labels"),
        ({"labels": {"-bad": "v"}}, "metadata.labels"),
        ({"annotations": {NET: "bridge"}}, f"metadata.annotations[{NET}]"),
    ],
)
def test_bad_metadata_is_422_naming_the_field(
    client: httpx.Client, metadata: dict[str, Any], field: str
) -> None:
    reply = client.post(SANDBOXES, json=sandbox(**metadata))
    assert reply.status_code == 422, reply.text
    assert causes(reply) == [field]


def test_an_unknown_template_is_422_not_503(client: httpx.Client) -> None:
    body = sandbox()
    body["spec"]["podTemplate"]["spec"]["containers"][0]["image"] = "no-such-template"
    reply = client.post(SANDBOXES, json=body)
    assert reply.status_code == 422
    assert causes(reply) == ["spec.podTemplate.spec.containers[0].image"]
    # A good request still reaches the claim (503 here: this store has no node access).
    assert client.post(SANDBOXES, json=sandbox()).status_code == 503


def test_a_deeply_nested_body_is_400(client: httpx.Client) -> None:
    for depth in (100_000, 900):
        reply = client.post(SANDBOXES, content=b"[" * depth + b"]" * depth)
        assert reply.status_code == 400, (depth, reply.text)
        assert reply.json()["reason"] == "BadRequest"
    deep: Any = "leaf"
    for _ in range(500):
        deep = {"d": deep}
    body = sandbox()
    body["spec"]["deep"] = deep  # parses, but answering it would recurse too far
    assert client.post(SANDBOXES, json=body).status_code == 400


@pytest.mark.parametrize("name", ["a\tb", "a\x00b", "a\x7fb", "a b", "%"])
def test_a_control_character_in_a_name_is_404(client: httpx.Client, name: str) -> None:
    for method in ("GET", "DELETE"):
        reply = client.request(method, f"{SANDBOXES}/{quote(name, safe='')}")
        assert reply.status_code == 404, (method, name, reply.text)


def test_a_client_that_hangs_up_mid_body_is_one_line(
    client: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    url = urlsplit(str(client.base_url))
    with socket.create_connection((url.hostname, url.port)) as sock:
        head = (
            f"POST {SANDBOXES} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: {AUTH['Authorization']}\r\nContent-Length: 5000\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"apiVersion": ')
    wait_until(lambda: any("hung up" in r.getMessage() for r in caplog.records), what="the line")
    assert client.get("/healthz").status_code == 200  # the server is fine
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert len([r for r in caplog.records if "hung up" in r.getMessage()]) == 1

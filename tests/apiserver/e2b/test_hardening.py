"""The e2b API's bounds, over real agents: a control
character in a sandbox id, a deeply nested body, an oversized body and a client that hangs
up mid-body are the client's mistakes (4xx, or one log line), never a 500 or a traceback.
The Sandbox API beside it answers control characters in a name the same way."""

from __future__ import annotations

import logging
import socket
from urllib.parse import quote, urlsplit

import httpx
import pytest

from sandboxctl.apiserver.e2b.app import MAX_BODY_BYTES
from tests.apiserver.e2b.stack import KEY_A, Stack
from tests.apiserver.helpers import AUTH, trusting
from tests.sandboxd.servers import wait_until

BAD_IDS = ["a\tb", "a\x00b", "sb-\x1b[2J", "a b", "%", "a/../b"]
ROUTES = [
    ("GET", "/sandboxes/{id}"),
    ("DELETE", "/sandboxes/{id}"),
    ("POST", "/sandboxes/{id}/timeout"),
    ("POST", "/sandboxes/{id}/refreshes"),
    ("POST", "/sandboxes/{id}/connect"),
    ("POST", "/v2/sandboxes/{id}/connect"),
    ("POST", "/sandboxes/{id}/pause"),
    ("POST", "/sandboxes/{id}/resume"),
    ("GET", "/sandboxes/{id}/logs"),
    ("GET", "/v2/sandboxes/{id}/logs"),
]


@pytest.mark.parametrize("sandbox_id", BAD_IDS)
def test_a_control_character_in_an_id_is_a_client_error(
    stack: Stack, sandbox_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    with httpx.Client(base_url=stack.api_url, headers={"X-API-Key": KEY_A}) as http:
        for method, route in ROUTES:
            path = route.format(id=quote(sandbox_id, safe=""))
            reply = http.request(method, path, json={"timeout": 30})
            assert reply.status_code in (400, 404), (method, path, reply.text)
            assert set(reply.json()) == {"code", "message"}
    kube = f"{stack.kube_url}/apis/agents.x-k8s.io/v1beta1/namespaces/default/sandboxes/"
    for method in ("GET", "DELETE"):
        reply = httpx.request(
            method, kube + quote(sandbox_id, safe=""), headers=AUTH, verify=trusting()
        )
        assert reply.status_code == 404, (method, reply.text)
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


def test_a_deeply_nested_body_is_400(stack: Stack) -> None:
    with httpx.Client(base_url=stack.api_url, headers={"X-API-Key": KEY_A}) as http:
        for path in ("/sandboxes", "/v2/sandboxes", "/sandboxes/sb-x/timeout"):
            reply = http.post(path, content=b"[" * 100_000 + b"]" * 100_000)
            assert reply.status_code == 400, (path, reply.text)
            assert reply.json()["message"] == "request body is not valid JSON: nested too deeply"


def test_a_body_over_the_cap_is_413(stack: Stack) -> None:
    with httpx.Client(base_url=stack.api_url, headers={"X-API-Key": KEY_A}) as http:
        reply = http.post("/sandboxes", content=b" " * (MAX_BODY_BYTES + 1))
    assert reply.status_code == 413
    assert reply.json()["code"] == 413


def test_a_client_that_hangs_up_mid_body_is_one_line(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    url = urlsplit(stack.api_url)
    with socket.create_connection((url.hostname, url.port)) as sock:
        head = (
            "POST /sandboxes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"X-API-Key: {KEY_A}\r\nContent-Length: 5000\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"templateID": ')
    wait_until(lambda: any("hung up" in r.getMessage() for r in caplog.records), what="the line")
    assert httpx.get(f"{stack.api_url}/health").status_code == 204
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert len([r for r in caplog.records if "hung up" in r.getMessage()]) == 1

"""A test-only stand-in for the proxy: serves the SDK's ``connect`` call and forwards its
envd requests (routed by ``E2b-Sandbox-Id``) to the agent's
``/v1/sandboxes/{id}/envd/...`` with that sandbox's Bearer token, streaming both ways."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn

from sandboxctl.envd import ENVD_VERSION
from tests.sandboxd.servers import free_port, wait_until

HOP = {b"host", b"content-length", b"transfer-encoding", b"connection", b"authorization"}


class Shim:
    def __init__(self, agent_address: str) -> None:
        self.agent = f"http://{agent_address}"
        self.tokens: dict[str, str] = {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = dict(scope["headers"])
        path: str = scope["path"]
        if path.startswith("/v2/sandboxes/") and path.endswith("/connect"):
            sandbox_id = path.split("/")[3]
            body = {
                "sandboxID": sandbox_id,
                "templateID": "base",
                "clientID": "shim",
                "envdVersion": ENVD_VERSION,
                "envdAccessToken": "unused",
                "domain": None,
            }
            await _reply(send, 200, json.dumps(body).encode())
            return
        sandbox_id = headers.get(b"e2b-sandbox-id", b"").decode()
        if sandbox_id not in self.tokens:
            message = {"code": 502, "message": f"The sandbox {sandbox_id} was not found"}
            await _reply(send, 502, json.dumps(message).encode())
            return
        forwarded = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP]
        forwarded.append((b"authorization", f"Bearer {self.tokens[sandbox_id]}".encode()))
        url = f"{self.agent}/v1/sandboxes/{sandbox_id}/envd{path}"
        if scope["query_string"]:
            url += "?" + scope["query_string"].decode()

        async def body() -> AsyncIterator[bytes]:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return
                yield message.get("body", b"")
                if not message.get("more_body", False):
                    return

        async with httpx.AsyncClient(timeout=None) as client:
            request = client.build_request(scope["method"], url, headers=forwarded, content=body())
            response = await client.send(request, stream=True)
            try:
                out = [(k, v) for k, v in response.headers.raw if k.lower() not in HOP]
                await send(
                    {"type": "http.response.start", "status": response.status_code, "headers": out}
                )
                async for chunk in response.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
            finally:
                await response.aclose()


async def _reply(send: Any, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


@contextmanager
def shim_serving(shim: Shim) -> Iterator[str]:
    port = free_port()
    config = uvicorn.Config(shim, host="127.0.0.1", port=port, log_level="error", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, what="the shim to listen")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)

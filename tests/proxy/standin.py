"""A stand-in host agent for the envd proxy's tests: the by-id read the proxy resolves
claim tokens with (``GET /v1/sandboxes/{id}``, fleet token) and envd under
``/v1/sandboxes/{id}/envd/<rest>`` (claim token): ``echo``, ``stream`` (waits on an event
between two chunks), ``upload`` (a sink that counts) and ``health``. It counts every
request it receives."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

Message = MutableMapping[str, Any]


@dataclass
class Upload:
    chunks: int = 0
    received: int = 0
    done: bool = False


@dataclass
class StandIn:
    fleet_token: str
    tokens: dict[str, str]  # claim id -> claim token
    requests: list[str] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    upload: Upload = field(default_factory=Upload)
    hung_up: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    async def __call__(
        self,
        scope: Message,
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            return
        with self._lock:
            self.requests.append(f"{scope['method']} {scope['path']}")
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        parts = scope["path"].split("/", 5)  # '', v1, sandboxes, id, envd, rest
        if len(parts) < 4 or parts[1:3] != ["v1", "sandboxes"]:
            await _json(send, 404, {"error": "no such path"})
            return
        claim_id = parts[3]
        token = self.tokens.get(claim_id)
        bearer = headers.get("authorization", "")
        if len(parts) == 4:  # the agent's by-id read
            if bearer != f"Bearer {self.fleet_token}":
                await _json(send, 401, {"error": "bad fleet token"})
            elif token is None:
                await _json(send, 404, {"error": f"sandbox {claim_id} not found"})
            else:
                row = {"id": claim_id, "key": {"template": "base"}, "token": token}
                await _json(send, 200, row)
            return
        if token is None or parts[4] != "envd":
            await _json(send, 404, {"error": "not found"})
            return
        if bearer != f"Bearer {token}":
            await _json(send, 401, {"error": "bad claim token"})
            return
        rest = "/" + (parts[5] if len(parts) > 5 else "")
        if rest == "/health":
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
        elif rest == "/stream":
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/connect+json")],
                }
            )
            await send({"type": "http.response.body", "body": b"first\n", "more_body": True})
            released = await asyncio.to_thread(self.release.wait, 30)
            tail = b"second\n" if released else b"timed out\n"
            await send({"type": "http.response.body", "body": tail})
        elif rest == "/hold":  # one chunk, then hold until the relay hangs up
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"first\n", "more_body": True})
            while (await receive())["type"] != "http.disconnect":
                pass
            self.hung_up.set()
        elif rest == "/upload":
            while True:
                message = await receive()
                chunk = message.get("body", b"")
                if chunk:
                    self.upload.chunks += 1
                    self.upload.received += len(chunk)
                if not message.get("more_body", False):
                    break
            self.upload.done = True
            body = {"chunks": self.upload.chunks, "received": self.upload.received}
            await _json(send, 200, body)
        else:
            data = b""
            while True:
                message = await receive()
                data += message.get("body", b"")
                if not message.get("more_body", False):
                    break
            echo = {
                "method": scope["method"],
                "path": scope["path"],
                "raw_path": scope["raw_path"].decode(),
                "query": scope["query_string"].decode(),
                "headers": headers,
                "body": data.decode(),
            }
            await _json(send, 200, echo)


async def _json(send: Callable[[Message], Awaitable[None]], status: int, body: Any) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": payload})

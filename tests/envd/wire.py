"""A plain httpx envd client shaped like the e2b SDK's requests (e2b-wire §3)."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

STREAM = "application/connect+json"


def envelope(message: Any, flags: int = 0) -> bytes:
    data = json.dumps(message).encode()
    return struct.pack(">BI", flags, len(data)) + data


def chunked(data: bytes, size: int = 7) -> Iterator[bytes]:
    """A generator body: httpx sends it with Transfer-Encoding: chunked."""
    for start in range(0, len(data), size):
        yield data[start : start + size]


def envelopes(body: bytes) -> list[tuple[int, dict[str, Any]]]:
    out = []
    while body:
        flags, length = struct.unpack(">BI", body[:5])
        out.append((flags, json.loads(body[5 : 5 + length])))
        body = body[5 + length :]
    return out


@dataclass
class Envd:
    address: str
    sandbox_id: str
    token: str

    @property
    def base(self) -> str:
        return f"http://{self.address}/v1/sandboxes/{self.sandbox_id}/envd"

    def headers(self, **extra: str) -> dict[str, str]:
        return {
            "authorization": f"Bearer {self.token}",
            "connect-protocol-version": "1",
            "e2b-sandbox-id": self.sandbox_id,
            "e2b-sandbox-port": "49983",
            **extra,
        }

    def rpc(self, method: str, message: dict[str, Any], timeout_ms: int = 30000) -> httpx.Response:
        return httpx.post(
            f"{self.base}/{method}",
            content=json.dumps(message),
            headers=self.headers(
                **{"content-type": "application/json", "connect-timeout-ms": str(timeout_ms)}
            ),
            timeout=30,
        )

    def stream(
        self, method: str, message: dict[str, Any], timeout_ms: int = 30000
    ) -> tuple[httpx.Response, list[tuple[int, dict[str, Any]]]]:
        response = httpx.post(
            f"{self.base}/{method}",
            content=chunked(envelope(message)),
            headers=self.headers(
                **{
                    "content-type": STREAM,
                    "connect-timeout-ms": str(timeout_ms),
                    "keepalive-ping-interval": "50",
                }
            ),
            timeout=60,
        )
        return response, envelopes(response.content) if response.status_code == 200 else []

    def run(self, cmd: str, **process: Any) -> dict[str, Any]:
        """commands.run: stdout, stderr, the end event, the pid and every envelope."""
        response, events = self.stream(
            "process.Process/Start",
            {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", cmd], **process}, "stdin": False},
        )
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == STREAM
        stdout, stderr, end = b"", b"", None
        for _flags, message in events[1:-1]:
            event = message["event"]
            if "data" in event:
                stdout += base64.b64decode(event["data"].get("stdout", ""))
                stderr += base64.b64decode(event["data"].get("stderr", ""))
            if "end" in event:
                end = event["end"]
        return {
            "pid": events[0][1]["event"]["start"]["pid"],
            "stdout": stdout.decode(),
            "stderr": stderr.decode(),
            "end": end,
            "events": events,
        }

"""A plain httpx envd client shaped like the e2b SDK's requests."""

from __future__ import annotations

import base64
import json
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from tests.sandboxd.servers import wait_until

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

    @contextmanager
    def opened(
        self, method: str, message: dict[str, Any], timeout_ms: int = 30000
    ) -> Iterator[Messages]:
        """A server stream read as it comes: act between its messages."""
        headers = self.headers(**{"content-type": STREAM, "connect-timeout-ms": str(timeout_ms)})
        url = f"{self.base}/{method}"
        with httpx.stream(
            "POST", url, content=envelope(message), headers=headers, timeout=20
        ) as reply:
            yield Messages(reply)

    def background(self, method: str, message: dict[str, Any]) -> Background:
        """``stream`` on a thread of its own, while the test acts on the command."""
        return Background(self, method, message)

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


def stream_error(response: httpx.Response) -> dict[str, Any]:
    """The error of a streaming call that failed before its first message: Connect
    answers HTTP 200 with one end-of-stream envelope that carries it."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == STREAM
    [(flags, message)] = envelopes(response.content)
    assert flags == 2
    error: dict[str, Any] = message["error"]
    return error


class Messages:
    """The envelopes of a stream being read: ``next()`` waits for the next whole one."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._chunks = response.iter_raw()
        self._buffer = b""

    def next(self) -> tuple[int, dict[str, Any]]:
        while len(self._buffer) < 5 or len(self._buffer) < 5 + int.from_bytes(
            self._buffer[1:5], "big"
        ):
            self._buffer += next(self._chunks)
        length = 5 + int.from_bytes(self._buffer[1:5], "big")
        [found], self._buffer = envelopes(self._buffer[:length]), self._buffer[length:]
        return found

    def rest(self) -> list[tuple[int, dict[str, Any]]]:
        """Every envelope up to the end of the stream."""
        return envelopes(self._buffer + b"".join(self._chunks))


class Background:
    def __init__(self, envd: Envd, method: str, message: dict[str, Any]) -> None:
        self._envd = envd
        self._result: list[tuple[httpx.Response, list[tuple[int, dict[str, Any]]]]] = []
        self._thread = threading.Thread(
            target=lambda: self._result.append(envd.stream(method, message)), daemon=True
        )
        self._thread.start()

    def listed(self) -> dict[str, Any]:
        """The command's row in ``List``, once it is there."""

        def row() -> dict[str, Any] | None:
            found = self._envd.rpc("process.Process/List", {}).json().get("processes", [])
            return found[0] if found else None

        listed: dict[str, Any] = wait_until(row, what="the command to be listed")
        return listed

    def result(self) -> tuple[httpx.Response, list[tuple[int, dict[str, Any]]]]:
        """The stream's response and envelopes, once it has ended."""
        self._thread.join(timeout=20)
        assert self._result, "the stream did not end"
        return self._result[0]

"""The Connect protocol, JSON codec only: envelopes, errors, deadlines.

Unary calls answer ``application/json``; server streams answer ``application/connect+json``
as envelopes (a flags byte, a big-endian uint32 length, the JSON message) ending with an
end-of-stream envelope (flags 0x02) that carries ``{}`` or ``{"error": {...}}``.

Errors follow the call's kind: a unary call gets the code's HTTP status and a JSON body; a
streaming call (its request is ``application/connect+...``) always gets HTTP 200 and the
error in the end-of-stream envelope, even when it fails before its first message, since
that is where Connect clients (the JS SDK) read a stream's error from.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import JSONResponse, Response

STREAM_CONTENT_TYPE = "application/connect+json"
END_STREAM = 0x02
MAX_MESSAGE_BYTES = 4 << 20

STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}


class ConnectError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code if code in STATUS else "unknown"
        self.message = message

    @property
    def status(self) -> int:
        return STATUS[self.code]

    def json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def error_response(error: ConnectError) -> JSONResponse:
    return JSONResponse(error.json(), status_code=error.status)


def is_stream_request(content_type: str) -> bool:
    """Whether a request with this content type is a streaming call (Connect's
    ``application/connect+<codec>``), whose errors go in the end-of-stream envelope."""
    media_type = content_type.split(";")[0].strip().lower()
    return media_type.startswith("application/connect+")


def stream_error_response(error: ConnectError) -> Response:
    """A streaming call that failed before its first message: HTTP 200 and a stream of
    one end-of-stream envelope carrying the error."""
    return Response(end_of_stream(error), media_type=STREAM_CONTENT_TYPE)


def envelope(message: Any, flags: int = 0) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(data)) + data


def end_of_stream(error: ConnectError | None = None) -> bytes:
    return envelope({"error": error.json()} if error else {}, END_STREAM)


def parse_envelope(body: bytes) -> dict[str, Any]:
    """The single message of a server-streaming request body."""
    if len(body) < 5:
        raise ConnectError("invalid_argument", "request body is not a Connect envelope")
    flags, length = struct.unpack(">BI", body[:5])
    if flags & 0x01:
        raise ConnectError("unimplemented", "compressed messages are not supported")
    if len(body) < 5 + length:
        raise ConnectError("invalid_argument", "truncated Connect envelope")
    return parse_json(body[5 : 5 + length])


async def read_envelopes(
    chunks: AsyncIterator[bytes], limit: int = MAX_MESSAGE_BYTES
) -> AsyncIterator[dict[str, Any]]:
    """The messages of a client-streaming request body, each as soon as it is whole;
    ends at the body's end or at an end-of-stream envelope."""
    buffer = bytearray()
    async for chunk in chunks:
        buffer += chunk
        while len(buffer) >= 5:
            flags, length = struct.unpack(">BI", buffer[:5])
            if flags & 0x01:
                raise ConnectError("unimplemented", "compressed messages are not supported")
            if length > limit:
                raise ConnectError("resource_exhausted", "request message too large")
            if len(buffer) < 5 + length:
                break
            data = bytes(buffer[5 : 5 + length])
            del buffer[: 5 + length]
            if flags & END_STREAM:
                return
            yield parse_json(data)
    if buffer:
        raise ConnectError("invalid_argument", "truncated Connect envelope")


def parse_json(data: bytes) -> dict[str, Any]:
    if not data.strip():
        return {}
    try:
        message = json.loads(data)
    except (ValueError, RecursionError):
        raise ConnectError("invalid_argument", "request message is not valid JSON") from None
    if not isinstance(message, dict):
        raise ConnectError("invalid_argument", "request message must be a JSON object")
    return message


def deadline_of(headers: Any) -> float | None:
    """The monotonic deadline from ``connect-timeout-ms``, or None without one."""
    value = headers.get("connect-timeout-ms")
    if value is None:
        return None
    try:
        milliseconds = int(value)
    except ValueError:
        raise ConnectError("invalid_argument", "connect-timeout-ms is not an integer") from None
    if milliseconds <= 0:
        return None
    return time.monotonic() + milliseconds / 1000


def field(message: dict[str, Any], name: str, default: Any = None) -> Any:
    """A proto-JSON field by its lowerCamelCase name, or its snake_case one."""
    if name in message:
        return message[name]
    snake = "".join("_" + c.lower() if c.isupper() else c for c in name)
    return message.get(snake, default)

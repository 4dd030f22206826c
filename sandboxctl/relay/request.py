"""The request a relay sends on, as an intermediary forwards it (RFC 9110 §7.6).

The target is the caller's, byte for byte as it came on the request line (uvicorn's
``raw_path``): a path rebuilt from the decoded one would turn ``%20``, ``%0D`` or ``%2F``
into a space, a bare CR or a slash on the next hop's request line. Headers go on as the
caller sent them, less hop-by-hop ones (and those its Connection names) and the ones
the relay sets itself (the body's framing among them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

HOP_BY_HOP: Final = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
FRAMING: Final = frozenset({b"content-length", b"transfer-encoding"})


def raw_target(scope: dict[str, Any] | Any, skip_segments: int = 0) -> bytes:
    """The request's target as the caller sent it: its raw path (less its first
    ``skip_segments`` segments, a route's own prefix) and query."""
    path: bytes = scope.get("raw_path") or scope["path"].encode()
    if skip_segments:
        path = b"/" + b"/".join(path.split(b"/")[1 + skip_segments :])
    query: bytes = scope.get("query_string") or b""
    return path + b"?" + query if query else path


def passed_headers(
    raw: Iterable[tuple[bytes, bytes]], dropped: frozenset[bytes] = frozenset()
) -> list[tuple[bytes, bytes]]:
    """The caller's headers the next hop gets: none hop-by-hop, none its Connection
    names, none of the framing (set anew) and none of ``dropped`` (lower case)."""
    headers = list(raw)
    named = {
        option.strip().lower()
        for name, value in headers
        if name.lower() == b"connection"
        for option in value.split(b",")
    }
    skipped = HOP_BY_HOP | FRAMING | dropped | named
    return [(name, value) for name, value in headers if name.lower() not in skipped]


def request_head(
    method: str,
    target: bytes,
    host: bytes,
    headers: Sequence[tuple[bytes, bytes]],
    raw: Iterable[tuple[bytes, bytes]],
) -> tuple[bytes, bool]:
    """The request line and headers, the body framed as the caller's was (``raw``, its
    headers: chunked stays chunked, a Content-Length is kept); and whether it is
    chunked."""
    framing = {name.lower(): value for name, value in raw if name.lower() in FRAMING}
    chunked = b"transfer-encoding" in framing
    lines = [b"%s %s HTTP/1.1" % (method.encode("ascii"), target), b"host: " + host]
    lines += [name + b": " + value for name, value in headers]
    if chunked:
        lines.append(b"transfer-encoding: chunked")
    elif b"content-length" in framing:
        lines.append(b"content-length: " + framing[b"content-length"])
    return b"\r\n".join(lines) + b"\r\n\r\n", chunked

"""A streaming multipart/form-data parser: parts arrive as events, never whole."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

MAX_HEADER_BYTES = 16 << 10


class MultipartError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Begin:
    headers: dict[str, str]

    @property
    def filename(self) -> str | None:
        return _param(self.headers.get("content-disposition", ""), "filename")

    @property
    def name(self) -> str | None:
        return _param(self.headers.get("content-disposition", ""), "name")


@dataclass(frozen=True, slots=True)
class Data:
    data: bytes


@dataclass(frozen=True, slots=True)
class End:
    pass


Event = Begin | Data | End


def boundary_of(content_type: str) -> bytes:
    boundary = _param(content_type, "boundary")
    if not boundary:
        raise MultipartError("multipart body without a boundary")
    return boundary.encode("latin-1")


@dataclass
class MultipartParser:
    boundary: bytes
    _buffer: bytearray = field(default_factory=bytearray)
    _state: str = "preamble"  # preamble, after_delimiter, headers, body, done

    def feed(self, chunk: bytes) -> Iterator[Event]:
        self._buffer += chunk
        delimiter = b"--" + self.boundary
        body_end = b"\r\n" + delimiter
        while True:
            buffer = self._buffer
            if self._state == "preamble":
                index = buffer.find(delimiter)
                if index < 0:
                    del buffer[: max(0, len(buffer) - len(delimiter))]
                    return
                del buffer[: index + len(delimiter)]
                self._state = "after_delimiter"
            elif self._state == "after_delimiter":
                if len(buffer) < 2:
                    return
                if buffer[:2] == b"--":
                    self._state = "done"
                    buffer.clear()
                    return
                line_end = buffer.find(b"\r\n")
                if line_end < 0:
                    return
                del buffer[: line_end + 2]  # transport padding, then CRLF
                self._state = "headers"
            elif self._state == "headers":
                index = buffer.find(b"\r\n\r\n")
                if index < 0:
                    if buffer.startswith(b"\r\n"):  # a part without headers
                        del buffer[:2]
                        self._state = "body"
                        yield Begin({})
                        continue
                    if len(buffer) > MAX_HEADER_BYTES:
                        raise MultipartError("multipart part headers too large")
                    return
                yield Begin(_headers(bytes(buffer[:index])))
                del buffer[: index + 4]
                self._state = "body"
            elif self._state == "body":
                index = buffer.find(body_end)
                if index < 0:
                    keep = len(body_end) - 1
                    if len(buffer) > keep:
                        yield Data(bytes(buffer[: len(buffer) - keep]))
                        del buffer[: len(buffer) - keep]
                    return
                if index:
                    yield Data(bytes(buffer[:index]))
                yield End()
                del buffer[: index + len(body_end)]
                self._state = "after_delimiter"
            else:
                buffer.clear()
                return

    def close(self) -> None:
        if self._state != "done":
            raise MultipartError("multipart body ended early")


def _headers(block: bytes) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in block.decode("utf-8", errors="replace").split("\r\n"):
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return headers


def _param(header: str, name: str) -> str | None:
    pattern = rf'(?:^|;)\s*{re.escape(name)}\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^;\s]*))'
    match = re.search(pattern, header, re.IGNORECASE)
    if match is None:
        return None
    if match.group(1) is not None:
        return re.sub(r"\\(.)", r"\1", match.group(1))
    return match.group(2)

"""One HTTP/1.1 response, read as a strict intermediary reads it (RFC 9110, RFC 9112).

The server may be hostile (a program in a sandbox), and a kept connection carries the
next caller's request, so a response is taken as exactly one message whose end is known,
and its connection is reused only if nothing else came with it:

- Interim responses (1xx but 101) are read and dropped (ASGI cannot pass them on), and
  their connection is not reused.
- 101 is refused: the relay never asks to switch protocols (WebSockets go another way),
  nor does it relay a tunnel (a 2xx to CONNECT).
- The final status must be 200-599, the version HTTP/1.1 or 1.0.
- The answer to a HEAD, a 204 and a 304 end with their head, whatever their headers say
  (RFC 9110 §6.4.1). Any other body is framed by chunked, else by Content-Length, else
  by the server closing the connection (RFC 9112 §6.3). Any other transfer coding is
  refused: the relay would pass on bytes coded in a way no header it forwards says.
- A byte past the end makes the connection unusable, whether it came with the response
  or later (``connection.py``).

``httptools`` (llhttp, which is strict by default) checks the syntax: the status line,
header names and values (no CR, LF, NUL or other controls), Content-Length and chunk
sizes. The relay finds each head's end itself, so it knows where a body starts and, for
every framing, where the message ends.
"""

from __future__ import annotations

import enum
import re
from collections.abc import AsyncIterator
from typing import Final

import httptools

from sandboxctl.relay.connection import Connection, UpstreamError

HEAD_END: Final = b"\r\n\r\n"
MAX_HEAD: Final = 64 << 10
CUT: Final = "the server closed the connection before the response was complete"
# Controls but HTAB, CR and LF (which must come as CRLF, ending a line that is not
# folded): llhttp refuses them all, and uvicorn would raise on them halfway through a
# head. Checked once more over the whole head, so that no server's bytes can reach a
# client as a header of their own should llhttp ever be made lenient.
_CONTROL: Final = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _only_lines(head: bytes) -> bool:
    crlf = head.count(b"\r\n")
    return (
        head.count(b"\r") == crlf == head.count(b"\n")
        and b"\n " not in head
        and b"\n\t" not in head
        and not _CONTROL.search(head)
    )


class Framing(enum.Enum):
    EMPTY = "no body"
    LENGTH = "Content-Length"
    CHUNKED = "chunked"
    CLOSE = "until the server closes"


class _PastTheEnd(Exception):
    """Raised from llhttp's callback when a second message begins after the first."""


class _Head:
    """httptools callbacks for one message's head."""

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.body = False
        self.parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.body = True


class _ChunkedBody:
    """httptools callbacks for a chunked body, fed its head again first (so that llhttp
    knows the framing). No ``on_header``: httptools would gather the trailers (which are
    not relayed) in memory, and a trailer line that never ends would grow without end."""

    def __init__(self, head: bytes) -> None:
        self.complete = False
        self.body: list[bytes] = []
        self.parser = httptools.HttpResponseParser(self)
        self.parser.feed_data(head)

    def on_message_begin(self) -> None:
        if self.complete:  # stop llhttp before it parses bytes that belong to no request
            raise _PastTheEnd

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True

    def take_body(self) -> bytes:
        chunks, self.body = self.body, []
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class Response:
    """The final response to one request: its head at once, its body as it comes."""

    def __init__(
        self,
        connection: Connection,
        method: bytes,
        head: bytes,
        message: _Head,
        framing: Framing,
        after_head: bytes,
        *,
        length: int = 0,
        keep_alive: bool = False,
    ) -> None:
        self.method = method
        self.status: int = message.parser.get_status_code()
        self.headers = message.headers
        self.framing = framing
        self._connection = connection
        self._chunks = _ChunkedBody(head) if framing is Framing.CHUNKED else None
        self._pending = after_head  # read with the head, not yet handed on
        self._length = length
        self._keep_alive = keep_alive
        self._complete = False
        self._clean = True  # nothing came past the end
        self._tail = b""  # the last bytes of a chunked body fed to llhttp

    def reusable(self) -> bool:
        """Whether the connection may carry the next request: the message was read to
        its end, nothing came after it, and neither side asked to close."""
        return (
            self._complete
            and self._clean
            and self._keep_alive
            and self.framing is not Framing.CLOSE
            and self._connection.usable()
        )

    def body(self) -> AsyncIterator[tuple[bytes, bool]]:
        """The body in the pieces the server's writes arrive in, each with whether it is
        the last: the end comes with the last data when they arrive together (the last
        piece may be empty). A body cut short raises :class:`UpstreamError`."""
        if self.framing is Framing.LENGTH:
            return self._by_length()
        if self.framing is Framing.CHUNKED:
            return self._chunked()
        if self.framing is Framing.CLOSE:
            return self._until_close()
        return self._empty()

    async def _empty(self) -> AsyncIterator[tuple[bytes, bool]]:
        self._clean = not self._pending
        self._complete = True
        yield b"", True

    async def _by_length(self) -> AsyncIterator[tuple[bytes, bool]]:
        remaining = self._length
        data, self._pending = self._pending, b""
        while True:
            if len(data) > remaining:
                self._clean = False
                data = data[:remaining]
            remaining -= len(data)
            if not remaining:
                self._complete = True
                yield data, True
                return
            if data:
                yield data, False
            data = await self._connection.read()
            if not data:
                raise UpstreamError(CUT)

    async def _chunked(self) -> AsyncIterator[tuple[bytes, bool]]:
        message = self._chunks
        assert message is not None
        data, self._pending = self._pending, b""
        while True:
            if data:
                self._feed_chunked(data)
            if message.complete:
                self._complete = True
                yield message.take_body(), True
                return
            if message.body:
                yield message.take_body(), False
            data = await self._connection.read()
            if not data:
                raise UpstreamError(CUT)

    def _feed_chunked(self, data: bytes) -> None:
        message = self._chunks
        assert message is not None
        try:
            message.parser.feed_data(data)
        except httptools.HttpParserError as error:
            if not message.complete:
                raise UpstreamError(f"the chunked body does not parse: {error}") from None
            self._clean = False  # another message, or garbage, after the last chunk
        self._tail = data[-5:] if len(data) >= 5 else (self._tail + data)[-5:]
        # llhttp skips CR and LF after a message without telling. A chunked body ends
        # with exactly CRLF CRLF after a byte that is neither, so a longer run of them
        # at the end means bytes past the end.
        if message.complete and len(self._tail) - len(self._tail.rstrip(b"\r\n")) > 4:
            self._clean = False

    async def _until_close(self) -> AsyncIterator[tuple[bytes, bool]]:
        data, self._pending = self._pending, b""
        while data:
            yield data, False
            data = await self._connection.read()
        self._complete = True
        yield b"", True


async def read_response(connection: Connection, method: bytes) -> Response:
    """Read the answer to a request of ``method`` on ``connection`` up to the end of its
    final head; its body is read through :meth:`Response.body`. Raises
    :class:`UpstreamError` for anything but one valid final response."""
    data = b""
    interim = 0
    while True:
        head, data = await _next_head(connection, data, before_any=not interim)
        message = _parse_head(head)
        status = message.parser.get_status_code()
        if status >= 200 or status < 100:
            break
        interim += 1  # an interim response: dropped; the final one follows
    if not 200 <= status <= 599:
        raise UpstreamError(f"status {status} is not a final HTTP status")
    framing, length, keep_alive = _framing(message, method, status)
    return Response(
        connection,
        method,
        head,
        message,
        framing,
        data,
        length=length,
        keep_alive=keep_alive and not interim,
    )


async def _next_head(connection: Connection, data: bytes, before_any: bool) -> tuple[bytes, bytes]:
    """The next head (through its empty line) and the bytes read after it."""
    searched = 0
    while (end := data.find(HEAD_END, searched)) < 0:
        if len(data) > MAX_HEAD:
            raise UpstreamError(f"the response head is over {MAX_HEAD >> 10} KiB")
        searched = max(0, len(data) - len(HEAD_END) + 1)
        more = await connection.read()
        if not more:
            if before_any and not data:
                raise UpstreamError("the server closed the connection before answering")
            raise UpstreamError(CUT)
        data += more
    end += len(HEAD_END)
    if end > MAX_HEAD:
        raise UpstreamError(f"the response head is over {MAX_HEAD >> 10} KiB")
    if not data.startswith(b"HTTP/"):
        raise UpstreamError("the response does not start with a status line")
    return data[:end], data[end:]


def _parse_head(head: bytes) -> _Head:
    if not _only_lines(head):
        raise UpstreamError("the response has an invalid header")
    message = _Head()
    try:
        message.parser.feed_data(head)
    except (httptools.HttpParserError, httptools.HttpParserUpgrade) as error:
        if not (message.head_done and message.parser.get_status_code() == 101):
            raise UpstreamError(f"the response does not parse: {error}") from None
    if message.head_done and message.parser.get_status_code() == 101:
        raise UpstreamError("the server switched protocols (101) unasked")
    if not message.head_done or message.body:  # llhttp and the relay disagree on the end
        raise UpstreamError("the response head does not parse")
    version = message.parser.get_http_version()
    if version not in ("1.1", "1.0"):
        raise UpstreamError(f"HTTP/{version} is not HTTP/1.1")
    return message


def _framing(message: _Head, method: bytes, status: int) -> tuple[Framing, int, bool]:
    """How the body of the final response is delimited, its length, and whether the
    server keeps the connection open after it."""
    length: bytes | None = None
    codings: list[bytes] = []
    options: list[bytes] = []
    for name, value in message.headers:
        lowered = name.lower()
        if lowered == b"content-length":
            length = value  # one at most, digits only: llhttp checked
        elif lowered == b"transfer-encoding":
            codings += (coding.strip().lower() for coding in value.split(b","))
        elif lowered == b"connection":
            options += (option.strip().lower() for option in value.split(b","))
    http10 = message.parser.get_http_version() == "1.0"
    keep_alive = b"keep-alive" in options if http10 else b"close" not in options
    if method == b"CONNECT" and status < 300:
        raise UpstreamError("the server opened a tunnel (2xx to CONNECT), which is not relayed")
    if method == b"HEAD" or status in (204, 304):
        return Framing.EMPTY, 0, keep_alive
    if codings:
        if codings != [b"chunked"] or http10:
            raise UpstreamError("the response's transfer coding is not chunked alone")
        return Framing.CHUNKED, 0, keep_alive
    if length is not None:
        return Framing.LENGTH, int(length), keep_alive
    return Framing.CLOSE, 0, False

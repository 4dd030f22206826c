"""One HTTP/1.1 connection of the relay, and the errors of its exchanges.

A connection knows how many bytes arrived on it and how many were read, so the pool can
refuse one that holds bytes nobody asked for, and it closes itself when bytes arrive
while it sits idle: whatever they are, they answer no request, and the next request on it
would take them for its answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Final, SupportsIndex

READ_SIZE: Final = 1 << 16


class UpstreamError(Exception):
    """The server could not be reached, broke off, or did not answer with exactly one
    valid HTTP/1.1 response. The text names no host pid, pool key or host path (callers
    answer and log it)."""


class Unreachable(UpstreamError):
    """No connection could be opened: nothing listens, or it timed out."""


def os_error_text(error: BaseException) -> str:
    """What an OS error says, without the file name it may carry (``/proc/PID/...``
    names a host pid)."""
    if isinstance(error, TimeoutError):
        return "timed out"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return type(error).__name__


class WatchedReader(asyncio.StreamReader):
    """A StreamReader that counts the bytes fed to it and, while ``idle``, closes its
    transport on any byte."""

    def __init__(self) -> None:
        super().__init__(limit=READ_SIZE)
        self.received = 0
        self.idle = False
        self.transport: asyncio.BaseTransport | None = None

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:  # bytes, from the protocol
        self.received += len(data)  # type: ignore[arg-type]
        if self.idle and self.transport is not None:
            self.transport.close()
        super().feed_data(data)


async def open_stream(**where: Any) -> tuple[WatchedReader, asyncio.StreamWriter]:
    """``asyncio.open_connection(**where)``, read through a :class:`WatchedReader`."""
    loop = asyncio.get_running_loop()
    reader = WatchedReader()
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport, _ = await loop.create_connection(lambda: protocol, **where)
    reader.transport = transport
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


class Connection:
    def __init__(self, key: str, reader: WatchedReader, writer: asyncio.StreamWriter):
        self.key = key
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0
        self._taken = 0

    def usable(self) -> bool:
        """Open, not hung up, and holding no byte that was not read."""
        return not (
            self.writer.is_closing() or self.reader.at_eof() or self.reader.received != self._taken
        )

    def set_idle(self, idle: bool) -> None:
        self.reader.idle = idle

    def close(self) -> None:
        self.writer.close()

    async def read(self) -> bytes:
        """The next bytes that arrived (at most ``READ_SIZE``); empty once the server
        has closed its side."""
        try:
            data = await self.reader.read(READ_SIZE)
        except OSError as error:
            raise UpstreamError(f"reading the response failed: {os_error_text(error)}") from None
        self._taken += len(data)
        return data

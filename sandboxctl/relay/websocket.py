"""WebSocket relays: message by message between an ASGI server's socket and a
``websockets`` client (ASGI servers hand no raw connection over, so bytes cannot be
spliced)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any, Final

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

# A relayed message may be this large; a bigger one closes the relay (1009).
MAX_WEBSOCKET_MESSAGE: Final = 16 << 20


async def open_websocket(
    uri: str,
    *,
    sock: socket.socket | None = None,
    headers: Sequence[tuple[str, str]] = (),
    subprotocols: Sequence[str] = (),
) -> ClientConnection:
    """The relay's next hop: a WebSocket client connection to ``uri`` (over ``sock`` when
    given), offering the caller's subprotocols. No proxy from the environment, no
    compression of its own (frames go on as they come), no pings (the ends ping)."""
    return await connect(
        uri,
        sock=sock,
        additional_headers=list(headers),
        subprotocols=[Subprotocol(p) for p in subprotocols] or None,
        proxy=None,
        compression=None,
        max_size=MAX_WEBSOCKET_MESSAGE,
        ping_interval=None,
        user_agent_header=None,
    )


async def relay_websocket(
    receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
    send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    upstream: ClientConnection,
) -> None:
    """Relay messages between an accepted ASGI WebSocket and ``upstream``, both ways,
    until either end closes; the close code is passed on."""

    async def from_caller() -> None:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                await upstream.close(message.get("code", 1000))
                return
            if message.get("bytes") is not None:
                await upstream.send(message["bytes"])
            elif message.get("text") is not None:
                await upstream.send(message["text"])

    async def to_caller() -> None:
        with contextlib.suppress(ConnectionClosed):
            async for data in upstream:
                key = "bytes" if isinstance(data, bytes) else "text"
                await send({"type": "websocket.send", key: data})
        with contextlib.suppress(OSError, RuntimeError):  # the caller may be gone already
            await send({"type": "websocket.close", "code": upstream.close_code or 1000})

    tasks = [asyncio.create_task(from_caller()), asyncio.create_task(to_caller())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await upstream.close()

"""Passing a relayed response on to the ASGI server (uvicorn) the relay runs in.

uvicorn frames what it sends itself: it counts a Content-Length and chunks a body that
has none. So the relayed head keeps only what describes the content, and nothing that
would make uvicorn expect a body it will not get or refuse the head halfway.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from typing import Any, Final

from sandboxctl.core.ids import public_id
from sandboxctl.relay.connection import Unreachable, UpstreamError, os_error_text
from sandboxctl.relay.request import HOP_BY_HOP
from sandboxctl.relay.response import Response

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

# uvicorn adds its own Date and Server to every response: relayed ones would come twice.
ADDED_BY_THE_SERVER: Final = frozenset({b"date", b"server"})


# What uvicorn logs, as an error, when an app returns with its response unfinished.
UNFINISHED: Final = "ASGI callable returned without completing response."
# Set in the task that serves one request (uvicorn runs each in a task of its own, whose
# context the app's coroutines share), so it is never seen by another request.
_LEFT_UNFINISHED: ContextVar[bool] = ContextVar("relay_left_unfinished", default=False)


class CallerGone(Exception):
    """The caller hung up before its request body was read: the request is not finished
    upstream (its connection is closed), so the server never takes a part for the whole."""


def forwarded_headers(response: Response) -> list[tuple[bytes, bytes]]:
    """The response's headers less hop-by-hop ones (and those its Connection names), less
    Date and Server, and less a Content-Length that uvicorn would hold a body to: a 204
    has none (RFC 9110 §8.6); a 304 to a GET loses it (uvicorn's httptools server would
    wait for that many bytes); the answer to a HEAD keeps it (the length a GET would
    have: both of uvicorn's servers send it with no body)."""
    named = {
        option.strip().lower()
        for name, value in response.headers
        if name.lower() == b"connection"
        for option in value.split(b",")
    }
    drop_length = response.status == 204 or (response.status == 304 and response.method != b"HEAD")
    forwarded = []
    for name, value in response.headers:
        lowered = name.lower()
        if lowered in HOP_BY_HOP or lowered in ADDED_BY_THE_SERVER or lowered in named:
            continue
        if drop_length and lowered == b"content-length":
            continue
        forwarded.append((name, value))
    return forwarded


async def forward(response: Response, send: Send) -> None:
    """Send ``response`` on as an ASGI response, its body as it arrives. A body cut short
    raises :class:`UpstreamError` with the response unfinished: the caller must leave it
    so (and say so: :func:`leave_unfinished`), and uvicorn then drops the connection, so
    its client sees a cut stream, never a complete-looking short one."""
    await send(
        {
            "type": "http.response.start",
            "status": response.status,
            "headers": forwarded_headers(response),
        }
    )
    async for chunk, last in response.body():
        await send({"type": "http.response.body", "body": chunk, "more_body": not last})


def guest_port_failure(sandbox_id: str, port: int, error: UpstreamError | OSError) -> str:
    """What a guest-port request that got no response is answered (502), on either path
    (straight from the proxy or through the agent). A port nothing answers on is named
    with its sandbox (the SDK's spelling of the id), as the caller asked for them: never
    by the host pid or address the relay reached it through."""
    if isinstance(error, OSError):  # a connect of the caller's own (a WebSocket's)
        error = Unreachable(f"cannot connect: {os_error_text(error)}")
    if isinstance(error, Unreachable):
        return f"nothing answers on port {port} of sandbox {public_id(sandbox_id)}: {error}"
    return f"port {port} did not answer with one valid HTTP/1.1 response: {error}"


def leave_unfinished() -> None:
    """This request's response is left unfinished on purpose (the server cut its body,
    and the relay has logged which relay broke off and why): uvicorn still drops the
    connection, but does not log it as an app that forgot to finish."""
    _LEFT_UNFINISHED.set(True)


class _CutOnPurpose(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (_LEFT_UNFINISHED.get() and record.msg == UNFINISHED)


def quiet_cut_streams() -> None:
    """Keep uvicorn's error line about an unfinished response for real app errors: a
    response :func:`leave_unfinished` marked has its own line. Idempotent."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(known, _CutOnPurpose) for known in logger.filters):
        logger.addFilter(_CutOnPurpose())

"""The relay: HTTP/1.1 exchanges over kept-alive connections, and WebSocket relays.

An exchange streams the request head and body out, reads the response as a strict
intermediary (``response.py``: one final response per request, its end always known,
anything odd refused or the connection closed) and hands its body on as it arrives
(``forward.py`` passes it to the ASGI server). The envd proxy relays to the agents with
it (``proxy/upstream.py`` keeps their connections alive, shared by every tenant's
requests) and straight to guest ports (``proxy/guest.py``); the agent relays to guest
ports inside sandboxes (``sandboxd/guestports.py``). A WebSocket is relayed message by
message (``websocket.py``).

Responses are parsed with ``httptools`` (the C parser uvicorn serves with). Why not
httpx: it did the same job at about 60 % of the proxy's CPU per request (its anyio
streams, pool liveness checks and cookie handling), which alone cost more than the 1 ms
the proxy may add.
"""

from sandboxctl.relay.connection import (
    READ_SIZE,
    Connection,
    Unreachable,
    UpstreamError,
    WatchedReader,
    open_stream,
    os_error_text,
)
from sandboxctl.relay.forward import CallerGone, forward, forwarded_headers, guest_port_failure
from sandboxctl.relay.pool import (
    IDLE_SECONDS,
    MAX_IDLE_PER_AGENT,
    Upstream,
    authority,
    exchange_on,
    send_request,
)
from sandboxctl.relay.response import Framing, Response
from sandboxctl.relay.websocket import open_websocket, relay_websocket

__all__ = [
    "IDLE_SECONDS",
    "MAX_IDLE_PER_AGENT",
    "READ_SIZE",
    "CallerGone",
    "Connection",
    "Framing",
    "Response",
    "Unreachable",
    "Upstream",
    "UpstreamError",
    "WatchedReader",
    "authority",
    "exchange_on",
    "forward",
    "forwarded_headers",
    "guest_port_failure",
    "open_stream",
    "open_websocket",
    "os_error_text",
    "relay_websocket",
    "send_request",
]

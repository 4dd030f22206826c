"""The relay: HTTP/1.1 exchanges over kept-alive connections, and WebSocket relays.

An exchange sends the caller's request on (``request.py``: its target as the caller sent
it, no hop-by-hop header), reads the response as a strict intermediary (``response.py``:
one final response per request, its end always known, anything odd refused or the
connection closed) and hands its body on as it arrives (``forward.py`` passes it to the
ASGI server). The envd proxy relays to the agents with it (``proxy/upstream.py`` keeps
their connections alive, shared by every tenant's requests) and straight to guest ports
(``proxy/guest.py``); the agent relays to guest ports inside sandboxes
(``sandboxd/guestports.py``). A WebSocket is relayed message by message
(``websocket.py``).

Responses are parsed with ``httptools`` (the C parser uvicorn serves with). Why not
httpx: it did the same job at about 60 % of the proxy's CPU per request (its anyio
streams, pool liveness checks and cookie handling), which alone cost more than the 1 ms
the proxy may add.
"""

from sandboxctl.relay.connection import (
    Connection,
    Unreachable,
    UpstreamError,
    WatchedReader,
    open_stream,
    os_error_text,
)
from sandboxctl.relay.forward import (
    CallerGone,
    forward,
    guest_port_failure,
    leave_unfinished,
    quiet_cut_streams,
)
from sandboxctl.relay.pool import IDLE_SECONDS, MAX_IDLE_PER_AGENT, Upstream, authority
from sandboxctl.relay.request import passed_headers, raw_target, request_head
from sandboxctl.relay.response import Response
from sandboxctl.relay.websocket import open_websocket, relay_websocket

__all__ = [
    "IDLE_SECONDS",
    "MAX_IDLE_PER_AGENT",
    "CallerGone",
    "Connection",
    "Response",
    "Unreachable",
    "Upstream",
    "UpstreamError",
    "WatchedReader",
    "authority",
    "forward",
    "guest_port_failure",
    "leave_unfinished",
    "open_stream",
    "open_websocket",
    "os_error_text",
    "passed_headers",
    "quiet_cut_streams",
    "raw_target",
    "relay_websocket",
    "request_head",
]

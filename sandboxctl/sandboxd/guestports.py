"""Guest ports: HTTP to any TCP port a sandbox listens on, through the agent.

``/v1/sandboxes/{id}/ports/{port}/<path>`` (root or that sandbox's token) is relayed, as
a stream both ways, to ``127.0.0.1:{port}`` *inside* the sandbox's network namespace: the
agent opens that connection from a thread that has joined the namespace, so a sandbox
without any network (only ``lo``) and a server bound to its loopback are reached alike,
and nothing of the sandbox is exposed on the host. The envd proxy routes
``{port}-{id}.{domain}`` here (docs/envd-proxy.md). Nothing listening answers 502 at once.
Connections into a sandbox are kept alive and reused (``relay.Upstream``, keyed by the
sandbox's init pid and the port), as the proxy keeps its connections to the agents. The
guest's answers are checked by the relay (one final response per request, its end
known, a connection that carried anything more closed), so what reaches the proxy on
its connection to this agent, which every tenant's requests share, is one well-formed
response per request.
A WebSocket upgrade is relayed message by message (the guest's server answers the
handshake; ASGI servers hand no raw connection over, so bytes cannot be spliced).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import re
import socket
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import Final

from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send
from websockets.exceptions import InvalidHandshake

from sandboxctl.core.ids import public_id
from sandboxctl.relay import (
    CallerGone,
    Upstream,
    UpstreamError,
    WatchedReader,
    forward,
    guest_port_failure,
    leave_unfinished,
    open_stream,
    open_websocket,
    passed_headers,
    quiet_cut_streams,
    raw_target,
    relay_websocket,
    request_head,
)
from sandboxctl.sandboxd.agent import Agent
from sandboxctl.sandboxd.errors import AgentRefusal

# On the decoded path, whose guest part may hold any character (%0A included): DOTALL.
PATH: Final = re.compile(
    r"^/v1/sandboxes/(?P<id>[^/]+)/ports/(?P<port>[0-9]{1,5})(?P<rest>/.*)?$", re.DOTALL
)
CONNECT_TIMEOUT: Final = 5.0
CLONE_NEWNET: Final = 0x40000000
# The route's own segments (v1, sandboxes, ID, ports, PORT), before the guest's path.
ROUTE_SEGMENTS: Final = 5
# Not sent to the guest: the agent's Host and Authorization (the claim or root token),
# and Expect (uvicorn has answered a 100-continue already).
DROPPED: Final = frozenset({b"host", b"authorization", b"expect"})
_libc = ctypes.CDLL(None, use_errno=True)
log = logging.getLogger("sandboxctl.sandboxd.guestports")


def connect_inside(pid: int, port: int, timeout: float = CONNECT_TIMEOUT) -> socket.socket:
    """A TCP connection to ``127.0.0.1:port`` in the network namespace of ``pid``.

    A socket belongs to the namespace it was made in, so a fresh thread joins the
    namespace, connects and ends: no pooled thread ever runs in a sandbox's namespace."""
    result: Future[socket.socket] = Future()

    def run() -> None:
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns into the sandbox's network")
            finally:
                os.close(fd)
            result.set_result(socket.create_connection(("127.0.0.1", port), timeout))
        except BaseException as error:  # handed to the caller
            result.set_exception(error)

    thread = threading.Thread(target=run, name="guest port connect", daemon=True)
    thread.start()
    thread.join()
    return result.result()


async def _open_inside(key: str) -> tuple[WatchedReader, asyncio.StreamWriter]:
    """A pool connection for ``PID:PORT``: opened inside that process's namespace."""
    pid, port = (int(part) for part in key.split(":"))
    sock = await asyncio.to_thread(connect_inside, pid, port)
    return await open_stream(sock=sock)


class GuestPorts:
    """The ASGI app of the guest-port routes."""

    def __init__(self, agent: Agent, may_act_on: Callable[[Request, str], bool]) -> None:
        self.agent = agent
        self.may_act_on = may_act_on
        self._pool = Upstream(CONNECT_TIMEOUT, opener=_open_inside)
        quiet_cut_streams()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = PATH.match(scope["path"])
        assert found is not None  # routed here by the path
        sandbox_id, port = found["id"], int(found["port"])
        websocket = scope["type"] == "websocket"
        reply = _close if websocket else _reply
        # The auth check reads headers only; a WebSocket scope carries the same ones.
        if not self.may_act_on(Request({**scope, "type": "http"}), sandbox_id):
            await reply(send, 401, "the root token or this sandbox's token is required")
            return
        if not 1 <= port <= 65535:
            await reply(send, 400, f"port {port}: want 1-65535")
            return
        try:
            record = self.agent.get(sandbox_id)
        except AgentRefusal as error:
            await reply(send, error.status, str(error))
            return
        identity = self.agent.identity(record)
        if not self.agent.runtime.alive(identity):
            await reply(send, 502, f"sandbox {sandbox_id} is not running")
            return
        if not websocket:
            # Kept-alive connections per sandbox init and port; the pid names the network
            # (a pool key: it never appears in an answer or a log line).
            await self._relay(scope, receive, send, f"{identity.pid}:{port}", sandbox_id, port)
            return
        try:
            sock = await asyncio.to_thread(connect_inside, identity.pid, port)
        except OSError as error:
            await reply(send, 502, guest_port_failure(sandbox_id, port, error))
            return
        await self._websocket(scope, receive, send, sock, port)

    async def _websocket(
        self, scope: Scope, receive: Receive, send: Send, sock: socket.socket, port: int
    ) -> None:
        """A WebSocket upgrade: the guest's server is asked for the same path and
        subprotocols; once it accepts, messages are relayed both ways."""
        await receive()  # websocket.connect
        target = raw_target(scope, ROUTE_SEGMENTS).decode("latin-1")
        uri = f"ws://localhost:{port}{target}"
        try:
            upstream = await open_websocket(
                uri, sock=sock, subprotocols=scope.get("subprotocols", ())
            )
        except (OSError, InvalidHandshake, TimeoutError) as error:
            sock.close()
            await _close(send, 502, f"port {port}: the WebSocket upgrade failed: {error}")
            return
        await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
        await relay_websocket(receive, send, upstream)

    async def _relay(
        self, scope: Scope, receive: Receive, send: Send, key: str, sandbox_id: str, port: int
    ) -> None:
        raw = scope["headers"]
        named = {name.lower(): value for name, value in raw}
        host = named.get(b"x-forwarded-host") or b"localhost:%d" % port
        headers = passed_headers(raw, DROPPED)
        head, chunked = request_head(
            scope["method"], raw_target(scope, ROUTE_SEGMENTS), host, headers, raw
        )
        has_body = chunked or b"content-length" in named

        async def body() -> AsyncIterator[bytes]:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise CallerGone  # the guest must not take a part for the whole
                if message.get("body"):
                    yield message["body"]
                if not message.get("more_body", False):
                    return

        started = False

        async def relayed(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            async with self._pool.exchange(
                key, head, body() if has_body else None, chunked=chunked
            ) as response:
                await forward(response, relayed)
        except CallerGone:
            return
        except UpstreamError as error:
            shown = public_id(sandbox_id)  # as the SDK and the proxy's lines spell it
            if started:  # the response stays unfinished: the caller sees a cut stream
                log.info("guest port %d relay for %s broke off: %s", port, shown, error)
                leave_unfinished()
                return
            log.info("guest port %d relay for %s failed: %s", port, shown, error)
            await _reply(send, 502, guest_port_failure(sandbox_id, port, error))


async def _close(send: Send, status: int, message: str) -> None:
    """Refuse a WebSocket before it is accepted: uvicorn answers the upgrade with 403,
    which carries no text of ours, so the log has why."""
    log.info("guest-port WebSocket refused (%d): %s", status, message)
    await send({"type": "websocket.close", "code": 1008})


async def _reply(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    headers: list[tuple[bytes, bytes]] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})

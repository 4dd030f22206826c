"""Guest ports straight to the sandbox, when the proxy runs beside its agent.

A sandbox with a network has an address on a veth whose host end is named after it
(``links.host_end``). A proxy in the agent's network namespace connects to
``ADDRESS:PORT`` with its socket bound to that veth (``SO_BINDTODEVICE``): no hop through
the agent, and no way to reach anything but that sandbox. The binding is also the check
that the sandbox is still the one the remembered owner names: a released sandbox's veth is
gone with it (a new sandbox that reuses its address has another veth), and a proxy on
another host, or in another namespace, has no such device. The host may open
connections to a sandbox; the filter keeps the reverse closed (docs/network.md).

Only a server listening on the sandbox's address (or on all of them) is reached so; one
bound to the sandbox's loopback refuses, and the request goes through the agent, which
connects inside the sandbox (``sandboxd/guestports.py``). The outcome is remembered per
sandbox and port for ``REMEMBER_SECONDS``, so such a port costs no failed connect per
request. The guest sees the request the agent would have sent it, from the gateway's
address instead of 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Final

from sandboxctl.relay import Connection, Upstream, UpstreamError, WatchedReader, open_stream
from sandboxctl.sandboxd.network.firewall import GUEST_MARK
from sandboxctl.sandboxd.network.links import host_end

CONNECT_TIMEOUT: Final = 1.0
REMEMBER_SECONDS: Final = 2.0
REMEMBERED_MAX: Final = 4096


class DirectGuests:
    """Kept-alive connections to guest ports, bound to the sandboxes' veths."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.pool = Upstream(CONNECT_TIMEOUT, opener=_open_bound)
        self._clock = clock
        self._unreachable: dict[tuple[str, int], float] = {}  # -> until when

    @staticmethod
    def key(claim_id: str, address: str, port: int) -> str:
        return f"{host_end(claim_id)}/{address}:{port}"

    async def connect(self, claim_id: str, address: str, port: int) -> Connection | None:
        """A connection of ``pool`` to the guest port, or None: go through the agent."""
        if self._passed(claim_id, address, port):
            return None
        try:
            return await self.pool.connect(self.key(claim_id, address, port))
        except UpstreamError:
            self._refused(claim_id, port)
            return None

    async def open_socket(self, claim_id: str, address: str, port: int) -> socket.socket | None:
        """A new connected socket to the guest port (for a WebSocket), or None."""
        if self._passed(claim_id, address, port):
            return None
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                return await _connect_bound(self.key(claim_id, address, port))
        except (OSError, TimeoutError):
            self._refused(claim_id, port)
            return None

    def _passed(self, claim_id: str, address: str, port: int) -> bool:
        """True when this port is not to be tried directly: no address, or it refused
        within ``REMEMBER_SECONDS``."""
        if not address:
            return True
        until = self._unreachable.get((claim_id, port))
        if until is None:
            return False
        if until > self._clock():
            return True
        del self._unreachable[(claim_id, port)]
        return False

    def _refused(self, claim_id: str, port: int) -> None:
        if len(self._unreachable) >= REMEMBERED_MAX:
            self._unreachable.clear()
        self._unreachable[(claim_id, port)] = self._clock() + REMEMBER_SECONDS

    def close(self) -> None:
        self.pool.close()


async def _open_bound(key: str) -> tuple[WatchedReader, asyncio.StreamWriter]:
    return await open_stream(sock=await _connect_bound(key))


async def _connect_bound(key: str) -> socket.socket:
    """``DEVICE/ADDRESS:PORT`` -> a TCP socket connected through that device only."""
    device, _, target = key.partition("/")
    address, _, port = target.rpartition(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, device.encode())
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, GUEST_MARK)  # the filter's pass
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (address, int(port)))
    except BaseException:
        sock.close()
        raise
    return sock

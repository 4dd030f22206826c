"""The proxy's straight path to guest ports gives way to the agent's relay when it cannot
connect (no such veth here: another host's sandbox, or a released one), and remembers it."""

from __future__ import annotations

import asyncio
import socket

import pytest

from sandboxctl.clock import ManualClock
from sandboxctl.proxy import guest
from sandboxctl.proxy.guest import REMEMBER_SECONDS, DirectGuests


def test_no_veth_means_the_agent_and_is_remembered_for_a_while(clock: ManualClock) -> None:
    guests = DirectGuests(clock.monotonic)
    attempts: list[str] = []
    connect = guests.pool.connect

    async def counted(key: str) -> object:
        attempts.append(key)
        return await connect(key)

    guests.pool.connect = counted  # type: ignore[method-assign]

    async def run() -> None:
        # No sandbox of this id has a veth on this host: bound to nothing, no connection.
        assert await guests.connect("sb_0000deadbeef", "10.200.250.9", 8000) is None
        assert await guests.connect("sb_0000deadbeef", "10.200.250.9", 8000) is None
        assert len(attempts) == 1  # the second went to the agent without trying
        clock.advance(REMEMBER_SECONDS + 0.1)
        assert await guests.connect("sb_0000deadbeef", "10.200.250.9", 8000) is None
        assert len(attempts) == 2
        # A sandbox without an address (an agent without networks): never tried.
        assert await guests.connect("sb_0000deadbeef", "", 8000) is None
        assert await guests.open_socket("sb_0000deadbeef", "", 8000) is None
        assert await guests.open_socket("sb_0000deadbeef", "10.200.250.9", 8000) is None
        assert len(attempts) == 2

    asyncio.run(run())


def test_a_websocket_refused_is_remembered_too(
    clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    guests = DirectGuests(clock.monotonic)
    attempts: list[str] = []

    async def refused(key: str) -> socket.socket:
        attempts.append(key)
        raise ConnectionRefusedError("a server on the sandbox's loopback only")

    monkeypatch.setattr(guest, "_connect_bound", refused)

    async def run() -> None:
        assert await guests.open_socket("sb_0000deadbeef", "10.200.250.9", 8000) is None
        assert await guests.open_socket("sb_0000deadbeef", "10.200.250.9", 8000) is None
        assert len(attempts) == 1  # the second went to the agent without trying
        assert await guests.connect("sb_0000deadbeef", "10.200.250.9", 8000) is None
        assert len(attempts) == 1  # one refusal, whichever path asks
        clock.advance(REMEMBER_SECONDS + 0.1)
        assert await guests.open_socket("sb_0000deadbeef", "10.200.250.9", 8000) is None
        assert len(attempts) == 2

    asyncio.run(run())

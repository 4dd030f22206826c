"""The DNS forwarder sandboxes with internet use: the gateway address, port 53.

A relay of whole messages, UDP and TCP, to one upstream server (``--sandbox-dns``; by
default the first ``nameserver`` of the host's /etc/resolv.conf, which may be a loopback
resolver: the forwarder runs in the host's namespace). It parses nothing: a query goes out
on a socket of its own and the first answer on it comes back. Sandboxes reach it only
while their policy has internet (the ``dns`` set of the filter), and their /etc/resolv.conf
names the gateway.

It binds with IP_FREEBIND: the gateway address exists only while a sandbox's veth
carries it. It lives in a thread of the agent; while the agent is down, sandboxes have
no DNS (their other traffic is not affected).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from pathlib import Path
from typing import cast

log = logging.getLogger("sandboxctl.sandboxd")

IP_FREEBIND = getattr(socket, "IP_FREEBIND", 15)
QUERY_TIMEOUT = 5.0
MAX_TCP_MESSAGE = 65535 + 2


def host_resolver(resolv_conf: Path = Path("/etc/resolv.conf")) -> str | None:
    """The first IPv4 ``nameserver`` of the host, or None."""
    try:
        lines = resolv_conf.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver" and ":" not in fields[1]:
            return fields[1]
    return None


def split_server(text: str) -> tuple[str, int]:
    host, colon, port = text.rpartition(":")
    if colon and port.isdigit():
        return host, int(port)
    return text, 53


class DnsForwarder:
    def __init__(self, listen: str, upstream: tuple[str, int]) -> None:
        self.listen = listen
        self.upstream = upstream
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._sockets: list[socket.socket] = []
        self._udp: asyncio.BaseTransport
        self._tcp_server: asyncio.Server

    def start(self) -> None:
        try:
            udp = _bound(socket.SOCK_DGRAM, self.listen)
            tcp = _bound(socket.SOCK_STREAM, self.listen)
        except OSError as error:
            log.warning("no DNS for sandboxes: cannot listen on %s:53: %s", self.listen, error)
            self._loop.close()
            return
        tcp.listen(64)
        self._sockets = [udp, tcp]
        self._thread = threading.Thread(
            target=self._run, args=(udp, tcp), name="sandbox DNS", daemon=True
        )
        self._thread.start()
        log.info("sandbox DNS on %s:53, forwarded to %s:%d", self.listen, *self.upstream)

    def stop(self) -> None:
        if self._thread is None:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(QUERY_TIMEOUT)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._thread = None
        for sock in self._sockets:
            sock.close()
        self._loop.close()

    def _run(self, udp: socket.socket, tcp: socket.socket) -> None:
        asyncio.set_event_loop(self._loop)
        self._udp, _ = self._loop.run_until_complete(
            self._loop.create_datagram_endpoint(lambda: _Queries(self.upstream), sock=udp)
        )
        self._tcp_server = self._loop.run_until_complete(asyncio.start_server(self._tcp, sock=tcp))
        self._loop.run_forever()

    async def _close(self) -> None:
        self._udp.close()
        self._tcp_server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0)  # let the transports finish closing

    async def _tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(QUERY_TIMEOUT):
                up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            try:
                while True:
                    length = await reader.readexactly(2)
                    query = await reader.readexactly(int.from_bytes(length, "big"))
                    up_writer.write(length + query)
                    async with asyncio.timeout(QUERY_TIMEOUT):
                        answer_length = await up_reader.readexactly(2)
                        answer = await up_reader.readexactly(int.from_bytes(answer_length, "big"))
                    writer.write(answer_length + answer)
                    await writer.drain()
            finally:
                up_writer.close()
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


class _Queries(asyncio.DatagramProtocol):
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        asyncio.get_running_loop().create_task(self._forward(data, addr))

    async def _forward(self, query: bytes, client: tuple[str, int]) -> None:
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[bytes] = loop.create_future()

        class Upstream(asyncio.DatagramProtocol):
            def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
                if not answered.done():
                    answered.set_result(data)

        with contextlib.suppress(OSError, TimeoutError):
            transport, _ = await loop.create_datagram_endpoint(Upstream, remote_addr=self.upstream)
            try:
                transport.sendto(query)
                async with asyncio.timeout(QUERY_TIMEOUT):
                    answer = await answered
                if self.transport is not None:
                    self.transport.sendto(answer, client)
            finally:
                transport.close()


def _bound(kind: int, address: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, kind)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_IP, IP_FREEBIND, 1)
        sock.bind((address, 53))
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock

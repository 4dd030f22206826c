"""Test hosts for tests and benchmarks: network namespaces with TEST-NET addresses,
linked to this machine by a veth, made as the local kit makes its hosts
(:mod:`sandboxctl.lanes.hostnet`).

A test host has one or more addresses of a free /29 of 198.51.100.0/24 (this machine's
end of its veth takes the first), no default route, and runs small servers started with
``ip netns exec``. Nothing a test sends goes anywhere but loopback and these namespaces.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from sandboxctl.lanes import hostnet

TEST_NET = ipaddress.IPv4Network("198.51.100.0/24")

# A TCP server: answers every connection with the peer's address and closes it, or
# (mode "sink") reads until EOF and answers with the byte count.
TCP_SERVER = textwrap.dedent(
    """
    import socket, sys, threading
    host, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    server = socket.create_server((host, port), backlog=64)
    print("ready", flush=True)
    def serve(conn, peer):
        with conn:
            if mode == "sink":
                total = 0
                while True:
                    chunk = conn.recv(1 << 20)
                    if not chunk:
                        break
                    total += len(chunk)
                conn.sendall(str(total).encode())
            else:
                conn.sendall(peer[0].encode())
    while True:
        conn, peer = server.accept()
        threading.Thread(target=serve, args=(conn, peer), daemon=True).start()
    """
)

# A DNS server answering every A question with one address (the question echoed back).
DNS_SERVER = textwrap.dedent(
    """
    import socket, struct, sys
    host, answer = sys.argv[1], socket.inet_aton(sys.argv[2])
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((host, 53))
    print("ready", flush=True)
    while True:
        query, peer = sock.recvfrom(512)
        end = 12
        while query[end]:
            end += query[end] + 1
        question = query[12:end + 5]
        header = query[:2] + struct.pack(">HHHHH", 0x8180, 1, 1, 0, 0)
        record = b"\\xc0\\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + answer
        sock.sendto(header + question + record, peer)
    """
)


@dataclass
class NetHost:
    name: str
    link: str
    gateway: str  # this host's own address on the link
    addresses: list[str]
    servers: list[subprocess.Popen[str]] = field(default_factory=list)

    def serve_tcp(self, address: str, port: int, mode: str = "peer") -> None:
        self._start([sys.executable, "-c", TCP_SERVER, address, str(port), mode])

    def serve_dns(self, address: str, answer: str) -> None:
        self._start([sys.executable, "-c", DNS_SERVER, address, answer])

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", self.name, *argv], capture_output=True, text=True, check=False
        )

    def _start(self, argv: list[str]) -> None:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.name, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.servers.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the server is listening
        if line.strip() != "ready":
            _, error = proc.communicate(timeout=5)
            raise AssertionError(f"test host server did not start: {error}")


@contextmanager
def net_host(extra_addresses: int = 1) -> Iterator[NetHost]:
    """A test host with ``extra_addresses`` addresses of its own (at most 5)."""
    block = hostnet.free_test_block(TEST_NET, 29, "a test host")
    hosts = list(block.hosts())
    tag = f"{os.getpid() % 100000}{int(time.monotonic() * 1000) % 1000}"
    name, link = f"sbtest{tag}", f"tnh{tag}"[:15]
    gateway, addresses = str(hosts[0]), [str(a) for a in hosts[1 : 1 + extra_addresses]]
    net = hostnet.HostNet(block, gateway, (hostnet.NamespaceHost(name, link, tuple(addresses)),))
    host = NetHost(name, link, gateway, addresses)
    try:
        hostnet.link(net)
        yield host
    finally:
        for proc in host.servers:
            proc.kill()
            proc.communicate()
        hostnet.unlink(net)

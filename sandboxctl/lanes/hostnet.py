"""Hosts as network namespaces on this machine, each joined to it by a veth pair: the local
kit's two hosts (on a bridge) and the test hosts of the tests and benchmarks (one each,
the veth's own end carrying the gateway).

A host's end of its veth is ``eth0``, up with the host's addresses, beside ``lo``; there
is no default route inside, so a server in a host that looks up a name fails at once
instead of stalling on DNS. Everything is made with iproute2 (one ``ip -batch`` on this
side, one inside each host) and removed whole by :func:`unlink`, whatever of it was made.
"""

from __future__ import annotations

import ipaddress
import subprocess
from dataclasses import dataclass

from sandboxctl.lanes.model import LaneError
from sandboxctl.lanes.processes import run
from sandboxctl.sandboxd.network.sandboxes import free_block

INSIDE = "eth0"


@dataclass(frozen=True)
class NamespaceHost:
    netns: str
    link: str  # this machine's end of the veth (at most 15 bytes)
    addresses: tuple[str, ...]


@dataclass(frozen=True)
class HostNet:
    """Hosts on one block; the gateway is this machine's address on it, carried by the
    bridge, or (no bridge, one host) by the host's veth."""

    block: ipaddress.IPv4Network
    gateway: str
    hosts: tuple[NamespaceHost, ...]
    bridge: str | None = None


def free_test_block(net: ipaddress.IPv4Network, prefix: int, what: str) -> ipaddress.IPv4Network:
    """A block of ``net`` that no route or address of this machine overlaps (another
    kit's or test host's included), tried from an offset of this process's pid; ``what``
    names the hosts in the error."""
    found = free_block(net, prefix)
    if found is None:
        raise LaneError(f"no free /{prefix} in {net} for {what}")
    return found


def link(net: HostNet) -> None:
    """Make the namespaces, their veths and the bridge; :func:`unlink` removes what this
    made, also when it fails half way."""
    for host in net.hosts:
        run(["ip", "netns", "add", host.netns])
    prefix = net.block.prefixlen
    outside: list[str] = []
    if net.bridge is not None:
        outside += [
            f"link add {net.bridge} type bridge",
            f"addr add {net.gateway}/{prefix} dev {net.bridge}",
            f"link set {net.bridge} up",
        ]
    for host in net.hosts:
        outside.append(f"link add {host.link} type veth peer name {INSIDE} netns {host.netns}")
        if net.bridge is not None:
            outside.append(f"link set {host.link} master {net.bridge}")
        else:
            outside.append(f"addr add {net.gateway}/{prefix} dev {host.link}")
        outside.append(f"link set {host.link} up")
    run(["ip", "-batch", "-"], "\n".join(outside) + "\n")
    for host in net.hosts:
        inside = ["link set lo up", f"link set {INSIDE} up"]
        inside += [f"addr add {address}/{prefix} dev {INSIDE}" for address in host.addresses]
        run(["ip", "-n", host.netns, "-batch", "-"], "\n".join(inside) + "\n")


def unlink(net: HostNet) -> None:
    """Remove the veths, the namespaces and the bridge; what is already gone is skipped."""
    for host in net.hosts:
        subprocess.run(["ip", "link", "del", host.link], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", host.netns], capture_output=True, check=False)
    if net.bridge is not None:
        subprocess.run(["ip", "link", "del", net.bridge], capture_output=True, check=False)

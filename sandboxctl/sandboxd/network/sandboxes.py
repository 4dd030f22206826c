"""One agent's sandbox network: its subnet, veths, filter table and DNS forwarder.

The agent calls ``start`` with the sandboxes it adopts (their links are repaired and the
filter table rebuilt from them, which drops what a gone sandbox left), ``attach`` when a
sandbox starts (every egress dropped: warm sandboxes wait for a policy), ``apply`` at a
claim or a policy update (one nftables transaction, nothing else), ``detach`` when one is
destroyed, and ``stop`` at exit (``remove`` also drops the table and stops forwarding for
this agent: only after every sandbox is gone).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import subprocess
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandboxctl.core.errors import ConfigurationError
from sandboxctl.core.netpolicy import (
    NetworkPolicy,
    SandboxSubnet,
    first_free,
    overlapping,
    subnet,
)
from sandboxctl.sandboxd.hostlimits import CONNECTIONS_PER_SANDBOX
from sandboxctl.sandboxd.network.dns import DnsForwarder, host_resolver, split_server
from sandboxctl.sandboxd.network.firewall import TABLE_PREFIX, Firewall, Member
from sandboxctl.sandboxd.network.links import PREFIX, Links, host_end, owner_alias
from sandboxctl.sandboxd.network.nft import Nft, NftError
from sandboxctl.sandboxd.runtimedir import in_use

log = logging.getLogger("sandboxctl.sandboxd")

AUTO = "auto"
# Where "auto" looks for a free /24, from an offset derived from the agent's key so that
# agents on one host (two serve checkouts) start from different places.
AUTO_CANDIDATES = tuple(f"10.200.{n}.0/24" for n in range(256))
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
HOSTS_FILE = Path("/etc/hosts")
RESOLV_CONF = "resolv.conf"  # in the runtime dir: bound over every sandbox's


@dataclass(frozen=True, slots=True)
class Attachment:
    """What the network knows of one sandbox."""

    sandbox_id: str
    pid: int
    address: str
    policy: NetworkPolicy


class SandboxNetwork:
    def __init__(
        self,
        key: str,
        cidr: str = AUTO,
        dns_upstream: tuple[str, int] | None = None,
        runtime_dir: Path | None = None,
        connections: int = CONNECTIONS_PER_SANDBOX,
    ) -> None:
        """``key`` names this agent's table and veth alias (its runtime dir key);
        ``cidr`` is ``--sandbox-cidr`` (``auto``: a free /24 of 10.200.0.0/16, kept
        across restarts); ``dns_upstream`` None serves no DNS; ``connections`` is how
        many connections through the host each sandbox may have at once."""
        self.key = key
        self._connections = connections
        self._cidr = cidr
        self._dns_upstream = dns_upstream
        self._runtime_dir = runtime_dir
        self._links = Links()
        self._nft = Nft()
        self._subnet: SandboxSubnet | None = None
        self._firewall: Firewall | None = None
        self._dns: DnsForwarder | None = None
        self._alias = owner_alias(key)
        self._members: dict[str, Member] = {}  # to rebuild the table if it goes missing

    @property
    def subnet(self) -> SandboxSubnet:
        if self._subnet is None:
            raise RuntimeError("the sandbox network is not started")
        return self._subnet

    @property
    def resolv_conf(self) -> Path | None:
        """The file bound over each sandbox's /etc/resolv.conf, when DNS is served."""
        if self._dns_upstream is None or self._runtime_dir is None:
            return None
        return self._runtime_dir / RESOLV_CONF

    def start(self, adopted: Iterable[Attachment]) -> None:
        adopted = list(adopted)
        self._subnet = self._pick_subnet(adopted)
        if self._firewall is not None:
            self._firewall.close()
        self._firewall = Firewall(self._nft, self.key, self._subnet, self._connections)
        _enable_forwarding()
        for sandbox in adopted:
            self._links.attach(
                sandbox.pid, host_end(sandbox.sandbox_id), sandbox.address,
                self._subnet.gateway, self._alias,
            )  # fmt: skip
        self._members = {s.sandbox_id: self._member(s) for s in adopted}
        self._firewall.rebuild(self._members.values())
        keep = {host_end(s.sandbox_id) for s in adopted}
        for veth in self._links.owned(self._alias):
            if veth not in keep:
                self._links.detach(veth)
        self._remove_orphans()
        resolv = self.resolv_conf
        if resolv is not None and self._dns_upstream is not None:
            resolv.write_text(f"nameserver {self._subnet.gateway}\noptions edns0\n")
            resolv.chmod(0o644)
            self._dns = DnsForwarder(self._subnet.gateway, self._dns_upstream)
            self._dns.start()

    def attach(self, sandbox: Attachment) -> None:
        """Give a started sandbox its veth and address, filtered by its policy (joining
        the filter applies it: a warm sandbox's is the default, no egress)."""
        firewall = self._started()
        member = self._member(sandbox)
        self._healing(lambda: firewall.join(member))
        self._members[member.sandbox_id] = member
        try:
            self._links.attach(
                sandbox.pid, member.veth, sandbox.address, self.subnet.gateway, self._alias
            )
        except BaseException:
            self.detach(sandbox.sandbox_id, sandbox.address)
            raise

    def apply(self, sandbox: Attachment) -> None:
        member = self._member(sandbox)
        firewall = self._started()
        self._healing(lambda: firewall.apply(member))
        self._members[member.sandbox_id] = member

    def detach(self, sandbox_id: str, address: str) -> None:
        """Forget a destroyed sandbox: its veth (if the kernel has not) and its rules."""
        veth = host_end(sandbox_id)
        self._links.detach(veth)
        self._members.pop(sandbox_id, None)
        if address:
            firewall = self._started()
            member = Member(sandbox_id, veth, address, NetworkPolicy())
            self._healing(lambda: firewall.leave(member))

    def stop(self, remove: bool) -> None:
        if self._dns is not None:
            self._dns.stop()
        if self._firewall is not None:
            self._firewall.close()
        if remove and self._firewall is not None:
            for veth in self._links.owned(self._alias):
                self._links.detach(veth)
            self._firewall.remove()

    # --- internals ----------------------------------------------------------------------

    def _healing(self, change: Callable[[], None]) -> None:
        """Make a change; if the table is gone (removed by hand, or as an orphan by another
        agent's start while this one had no sandbox), rebuild it and make it again."""
        firewall = self._started()
        try:
            change()
        except NftError:
            if self._nft.list({"table": {"family": "inet", "name": firewall.table}}):
                raise
            log.warning("the filter table %s was gone: rebuilt", firewall.table)
            firewall.rebuild(self._members.values())
            change()

    def _remove_orphans(self) -> None:
        """Drop other agents' tables that filter nothing any more: no veth carries their
        alias, and their key names no runtime dir that may still serve an agent
        (``runtimedir.in_use``: a test run, or a fleet whose state dir was deleted). An
        agent whose table this removes while it has no sandbox rebuilds it at its next
        change."""
        root = self._runtime_dir.parent if self._runtime_dir is not None else None
        aliases = self._links.aliases()
        for item in self._nft.list({"tables": {"family": "inet"}}):
            name = item.get("table", {}).get("name", "")
            key = name.removeprefix(TABLE_PREFIX)
            if not name.startswith(TABLE_PREFIX) or key == self.key:
                continue
            if owner_alias(key) in aliases or (root is not None and in_use(root / key)):
                continue
            log.info("removing %s: no agent's sandbox uses it", name)
            self._nft.run(
                [{"add": {"table": {"family": "inet", "name": name}}},
                 {"delete": {"table": {"family": "inet", "name": name}}}]
            )  # fmt: skip

    def _started(self) -> Firewall:
        if self._firewall is None:
            raise RuntimeError("the sandbox network is not started")
        return self._firewall

    def _member(self, sandbox: Attachment) -> Member:
        return Member(
            sandbox.sandbox_id, host_end(sandbox.sandbox_id), sandbox.address, sandbox.policy
        )

    def _pick_subnet(self, adopted: list[Attachment]) -> SandboxSubnet:
        others = self._probe().subnets_of_others()
        taken = [*host_routes(), *others]
        mine = self._own_subnet()
        if self._cidr == AUTO:
            if mine is not None:
                chosen: SandboxSubnet | None = mine
            else:
                start = zlib.crc32(self.key.encode()) % len(AUTO_CANDIDATES)
                chosen = first_free(AUTO_CANDIDATES, taken, start)
            if chosen is None:
                raise ConfigurationError(
                    "no free /24 in 10.200.0.0/16 for sandboxes: give one with --sandbox-cidr"
                )
        else:
            chosen = subnet(self._cidr)
        clash = overlapping(chosen, taken)
        if clash is not None:
            raise ConfigurationError(
                f"--sandbox-cidr {chosen}: overlaps {clash}, a route or address of this host "
                "or another agent's sandbox subnet: pick a free one"
            )
        outside = [s.address for s in adopted if chosen.index_of(s.address) is None]
        if outside:
            raise ConfigurationError(
                f"--sandbox-cidr {chosen}: running sandboxes use {outside[0]}"
                + (f" in {mine}; start with --sandbox-cidr {mine}" if mine else "")
                + " or destroy them first (--destroy-on-exit)"
            )
        return chosen

    def _probe(self) -> Firewall:
        """A firewall for reading tables before the subnet is known."""
        return Firewall(self._nft, self.key, SandboxSubnet(ipaddress.IPv4Network("0.0.0.0/32")))

    def _own_subnet(self) -> SandboxSubnet | None:
        for entry in self._nft.list(
            {"set": {"family": "inet", "table": self._probe().table, "name": "subnet"}}
        ):
            for elem in entry.get("set", {}).get("elem", []):
                if isinstance(elem, dict) and "prefix" in elem:
                    return subnet(f"{elem['prefix']['addr']}/{elem['prefix']['len']}")
        return None


def sandbox_network(key: str, cidr: str, dns: str, runtime_dir: Path) -> SandboxNetwork:
    """The agent's sandbox network from ``--sandbox-cidr`` and ``--sandbox-dns``
    (``IP[:PORT]``, ``host``: the host's first nameserver, ``none``)."""
    upstream: tuple[str, int] | None
    if dns == "none":
        upstream = None
    elif dns == "host":
        found = host_resolver()
        upstream = (found, 53) if found else None
    else:
        upstream = split_server(dns)
    return SandboxNetwork(key, cidr, upstream, runtime_dir)


def host_routes() -> list[str]:
    """Destinations of the host's routes (every table but the default routes and the
    sandbox veths'), its addresses, and the addresses its hosts file names (a package
    mirror, say, reached by the default route): what a sandbox subnet or a test host's
    block must not overlap, or it would take that traffic."""
    found: list[str] = named_addresses()
    routes = _ip_json(["-4", "route", "show", "table", "all"])
    for route in routes:
        dst, dev = str(route.get("dst", "")), str(route.get("dev", ""))
        if dst in ("", "default") or dev.startswith(PREFIX) or route.get("type") == "broadcast":
            continue
        found.append(dst)
    for link in _ip_json(["-4", "addr", "show"]):
        if str(link.get("ifname", "")).startswith(PREFIX):
            continue
        infos: list[dict[str, Any]] = link.get("addr_info", [])  # type: ignore[assignment]
        for info in infos:
            found.append(f"{info['local']}/{info.get('prefixlen', 32)}")
    return [text for text in found if _parses(text)]


def named_addresses(hosts_file: Path | None = None) -> list[str]:
    """The IPv4 addresses (as /32) the hosts file (/etc/hosts) names, loopback left out."""
    try:
        lines = (hosts_file or HOSTS_FILE).read_text(errors="replace").splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        try:
            address = ipaddress.ip_address(fields[0])
        except ValueError:
            continue
        if address.version == 4 and not address.is_loopback:
            found.append(f"{address}/32")
    return found


def free_block(net: ipaddress.IPv4Network, new_prefix: int) -> ipaddress.IPv4Network | None:
    """A block of ``net`` that no route or address of this host overlaps, or None;
    tried from an offset of this process's pid, so that processes side by side pick
    different ones (the test hosts, a lanes kit's bridge)."""
    blocks = [str(block) for block in net.subnets(new_prefix=new_prefix)]
    found = first_free(blocks, host_routes(), start=os.getpid() % len(blocks))
    return found.network if found is not None else None


def _ip_json(args: list[str]) -> list[dict[str, object]]:
    result = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        return []
    loaded: list[dict[str, object]] = json.loads(result.stdout or "[]")
    return loaded


def _parses(text: str) -> bool:
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return True


def _enable_forwarding() -> None:
    """Sandboxes' egress is routed by the host: IPv4 forwarding must be on (the filter
    forwards nothing else of the host's for it)."""
    if IP_FORWARD.read_text().strip() != "1":
        IP_FORWARD.write_text("1\n")
        log.warning("enabled net.ipv4.ip_forward for sandbox egress")

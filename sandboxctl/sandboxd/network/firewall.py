"""The host-side filter and NAT of one agent's sandboxes: one nftables table.

``inet sandboxctl_KEY`` (KEY: the agent's runtime dir key), in order (docs/network.md):

* ``forward`` (filter): from one of this agent's veths -> ``from_sandbox``; to one ->
  ``to_sandbox`` (replies only).
* ``from_sandbox``: IPv6 dropped; a source address that is not the veth's own dropped;
  then, refused (``refuse``): a new connection beyond the sandbox's ``connections``
  tracked ones (the host's conntrack table is every sandbox's: one must not fill it for
  the others); anything routed out of another sandbox veth (any agent's); the sandbox
  subnet and ``ALWAYS_BLOCKED`` (loopback, link-local and metadata, multicast); then the
  sandbox's own chain ``sb_ID`` through the ``egress`` verdict map; whatever it returns
  is refused. ``sb_ID`` holds the sandbox's policy: first the gateway (accepted with
  internet, else returned: only DNS ever reaches it there), then its allow rules, its
  deny rules (``return``), and ``accept`` with internet. A claim replaces just these
  rules (``nftbatch``).
* ``input`` (filter): from this agent's veths -> ``to_host``: the answers of connections
  the host opened to the sandbox's own address (guest ports reached straight from the
  proxy); IPv6 and a spoofed source dropped; then DNS to the gateway through ``sb_ID``
  (within the same count of connections), everything else refused (every address of
  the host, on every port).
* ``refuse``: a TCP reset for TCP, an ICMP port unreachable for the rest, so a sandbox
  learns at once that it may not (a DNS lookup fails now, not after the resolver's
  timeouts). Only ever reached after the source is checked to be the sandbox's own
  address: the host never answers a spoofed source, so a refusal cannot be aimed at
  anyone but the sandbox that sent the packet. It opens nothing: the refused packet is
  still dropped, and its connection never confirmed.
* ``postrouting`` (nat): the subnet's traffic leaving by any interface but a sandbox veth
  is masqueraded: NAT out of the host's own route.

The table is the agent's alone, so agents on one host never touch each other's rules,
and it outlives the agent: sandboxes stay filtered while it is down. A start rebuilds it
in one transaction from the sandboxes it adopts, which drops whatever a gone sandbox left.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sandboxctl.core.netpolicy import ALWAYS_BLOCKED, NetworkPolicy, SandboxSubnet
from sandboxctl.sandboxd.hostlimits import CONNECTIONS_PER_SANDBOX
from sandboxctl.sandboxd.network.links import PREFIX
from sandboxctl.sandboxd.network.nft import Nft
from sandboxctl.sandboxd.network.nftbatch import ChainWriter, Rule

FAMILY = "inet"
TABLE_PREFIX = "sandboxctl_"
# The socket mark of a host connection that may reach a sandbox (the envd proxy's guest
# ports): setting it needs CAP_NET_ADMIN, so no unprivileged process on the host can
# open a connection a sandbox's answers come back on.
GUEST_MARK = 0x53420001
Command = dict[str, Any]
# The chain that answers a refused packet (a TCP reset, an ICMP port unreachable).
REFUSE = "refuse"
_REFUSED: dict[str, Any] = {"jump": {"target": REFUSE}}


@dataclass(frozen=True, slots=True)
class Member:
    """One sandbox as the filter knows it."""

    sandbox_id: str
    veth: str
    address: str
    policy: NetworkPolicy


def table_name(key: str) -> str:
    return TABLE_PREFIX + key


def chain_name(sandbox_id: str) -> str:
    return "sb_" + sandbox_id.removeprefix("sb_")


class Firewall:
    def __init__(
        self,
        nft: Nft,
        key: str,
        subnet: SandboxSubnet,
        connections: int = CONNECTIONS_PER_SANDBOX,
    ) -> None:
        """``connections``: how many connections (tracked by the host's conntrack) each
        sandbox may have at once; a new one beyond them is refused."""
        self.nft = nft
        self.table = table_name(key)
        self.subnet = subnet
        self.connections = connections
        self.writer = ChainWriter(FAMILY, self.table)

    # --- the table --------------------------------------------------------------------

    def rebuild(self, members: Iterable[Member]) -> None:
        """Replace the whole table with one holding exactly ``members`` (atomically), then
        give each its policy: until then a sandbox's egress is refused, never open."""
        members = list(members)
        commands: list[Command] = [{"add": {"table": self._table()}}]
        commands.append({"delete": {"table": self._table()}})
        commands += self._skeleton()
        for member in members:
            commands += self._join(member)
        self.nft.run(commands)
        for member in members:
            self.apply(member)

    def close(self) -> None:
        """Let go of the netlink socket the claims' rules are written through."""
        self.writer.close()

    def remove(self) -> None:
        """Drop the table (after the last sandbox is gone)."""
        self.nft.run([{"add": {"table": self._table()}}, {"delete": {"table": self._table()}}])

    def subnets_of_others(self) -> list[str]:
        """The subnets other agents' tables on this host filter (from their ``subnet``)."""
        found: list[str] = []
        for item in self.nft.list({"tables": {"family": FAMILY}}):
            table = item.get("table")
            if not table or not table["name"].startswith(TABLE_PREFIX):
                continue
            if table["name"] == self.table:
                continue
            listed = self.nft.list(
                {"set": {"family": FAMILY, "table": table["name"], "name": "subnet"}}
            )
            for entry in listed:
                for elem in entry.get("set", {}).get("elem", []):
                    found.append(_cidr(elem))
        return found

    # --- one sandbox ------------------------------------------------------------------

    def join(self, member: Member) -> None:
        """Filter a new sandbox: every egress refused until a claim applies its policy."""
        self.nft.run(self._join(member))
        self.apply(member)

    def apply(self, member: Member) -> None:
        """Replace the sandbox's rules with its policy: one transaction that reads
        nothing, so its cost does not grow with the tables on the host."""
        self.writer.replace(chain_name(member.sandbox_id), self.rules(member.policy))

    def rules(self, policy: NetworkPolicy) -> list[Rule]:
        """The rules of a sandbox's chain for ``policy``, in order. The gateway comes
        first: only DNS reaches this chain for it (from ``to_host``), and a sandbox gets
        DNS with internet only, whatever its allow and deny rules say. What the chain
        does not accept returns to its caller, which refuses it."""
        gateway = "accept" if policy.internet else "return"
        rules = [Rule(gateway, f"{self.subnet.gateway}/32")]
        rules += [Rule("accept", cidr) for cidr in policy.allow_out]
        # Denied: back to the caller, whose next rule refuses (``refuse``).
        rules += [Rule("return", cidr) for cidr in policy.denied]
        if policy.internet:
            rules.append(Rule("accept"))
        return rules

    def leave(self, member: Member) -> None:
        """Forget a sandbox: its elements and its chain. Idempotent (each element is
        added before it is deleted, in the same transaction)."""
        chain = chain_name(member.sandbox_id)
        commands: list[Command] = [
            {"add": {"chain": self._chain(chain)}},
            {"add": {"element": self._elements("egress", [[member.veth, _jump(chain)]])}},
            {"delete": {"element": self._elements("egress", [member.veth])}},
            {"delete": {"chain": self._chain(chain)}},
        ]
        for name, elem in self._memberships(member):
            commands.append({"add": {"element": self._elements(name, [elem])}})
            commands.append({"delete": {"element": self._elements(name, [elem])}})
        self.nft.run(commands)

    # --- commands ---------------------------------------------------------------------

    def _join(self, member: Member) -> list[Command]:
        chain = chain_name(member.sandbox_id)
        commands: list[Command] = [{"add": {"chain": self._chain(chain)}}]
        for name, elem in self._memberships(member):
            commands.append({"add": {"element": self._elements(name, [elem])}})
        commands.append(
            {"add": {"element": self._elements("egress", [[member.veth, _jump(chain)]])}}
        )
        return commands

    def _memberships(self, member: Member) -> list[tuple[str, Any]]:
        return [
            ("ifaces", member.veth),
            ("members", {"concat": [member.veth, member.address]}),
        ]

    def _skeleton(self) -> list[Command]:
        t = self._table()
        gateway = self.subnet.gateway
        commands: list[Command] = [
            {"add": {"table": t}},
            {
                "add": {
                    "set": {**self._in_table("subnet"), "type": "ipv4_addr", "flags": ["interval"]}
                }
            },
            {"add": {"element": self._elements("subnet", [_prefix(str(self.subnet))])}},
            {"add": {"set": {**self._in_table("ifaces"), "type": "ifname"}}},
            {"add": {"set": {**self._in_table("members"), "type": ["ifname", "ipv4_addr"]}}},
            {"add": {"map": {**self._in_table("egress"), "type": "ifname", "map": "verdict"}}},
            {
                "add": {
                    "set": {
                        **self._in_table("connections"),
                        "type": "ipv4_addr",
                        "size": max(self.subnet.network.num_addresses, 1),  # nft: dynamic
                    }
                }
            },
        ]
        for name in ("from_sandbox", "to_sandbox", "to_host", REFUSE):
            commands.append({"add": {"chain": self._chain(name)}})
        commands += [
            {"add": {"chain": self._base("forward", "filter", "forward", 0)}},
            {"add": {"chain": self._base("input", "filter", "input", 0)}},
            {"add": {"chain": self._base("output", "filter", "output", 0)}},
            {"add": {"chain": self._base("postrouting", "nat", "postrouting", 100)}},
            self._rule(
                "forward", [_in_set("iifname", "@ifaces"), {"jump": {"target": "from_sandbox"}}]
            ),
            self._rule(
                "forward", [_in_set("oifname", "@ifaces"), {"jump": {"target": "to_sandbox"}}]
            ),
            self._rule(
                "from_sandbox", [_match({"meta": {"key": "nfproto"}}, "ipv6"), {"drop": None}]
            ),
            self._rule(
                "from_sandbox",
                [
                    _match(
                        {"concat": [{"meta": {"key": "iifname"}}, _field("saddr")]},
                        "@members",
                        "!=",
                    ),
                    {"drop": None},
                ],
            ),
            # From here on the source is the sandbox's own: a refusal answers only it.
            self._rule("from_sandbox", self._over_connections()),
            self._rule(
                "from_sandbox", [_match({"meta": {"key": "oifname"}}, PREFIX + "*"), _REFUSED]
            ),
            *(
                self._rule("from_sandbox", [_daddr(cidr), _REFUSED])
                for cidr in (str(self.subnet), *ALWAYS_BLOCKED)
            ),
            self._rule(
                "from_sandbox", [{"vmap": {"key": {"meta": {"key": "iifname"}}, "data": "@egress"}}]
            ),
            self._rule("from_sandbox", [_REFUSED]),
            self._rule(
                "to_sandbox",
                [
                    {
                        "match": {
                            "op": "in",
                            "left": {"ct": {"key": "state"}},
                            "right": ["established", "related"],
                        }
                    },
                    {"accept": None},
                ],
            ),
            self._rule("to_sandbox", [{"drop": None}]),
            self._rule("input", [_in_set("iifname", "@ifaces"), {"jump": {"target": "to_host"}}]),
            # A connection the host opens to a sandbox with the guest mark: its conntrack
            # entry keeps the mark, which lets the sandbox's answers in (below).
            self._rule(
                "output",
                [
                    _in_set("oifname", "@ifaces"),
                    _match({"meta": {"key": "mark"}}, GUEST_MARK),
                    {"mangle": {"key": {"ct": {"key": "mark"}}, "value": GUEST_MARK}},
                ],
            ),
            # Answers on connections the host opened with the guest mark (the proxy to a
            # guest port), from the sandbox's own address: never a connection the sandbox
            # opens (its first packet is refused below, so conntrack never confirms it),
            # nor one an unprivileged host process opens (it cannot set the mark).
            self._rule(
                "to_host",
                [
                    _match({"concat": [{"meta": {"key": "iifname"}}, _field("saddr")]}, "@members"),
                    _match({"ct": {"key": "direction"}}, "reply"),
                    _match({"ct": {"key": "mark"}}, GUEST_MARK),
                    {"accept": None},
                ],
            ),
        ]
        # Before anything is refused: the host answers no IPv6 and no spoofed source
        # (a refusal sent there would be a packet the sandbox aims at someone else).
        commands += [
            self._rule("to_host", [_match({"meta": {"key": "nfproto"}}, "ipv6"), {"drop": None}]),
            self._rule(
                "to_host",
                [
                    _match(
                        {"concat": [{"meta": {"key": "iifname"}}, _field("saddr")]},
                        "@members",
                        "!=",
                    ),
                    {"drop": None},
                ],
            ),
            self._rule("to_host", self._over_connections()),
        ]
        for protocol in ("udp", "tcp"):
            commands.append(
                self._rule(
                    "to_host",
                    [
                        _match(_field("daddr"), gateway),
                        _match({"payload": {"protocol": protocol, "field": "dport"}}, 53),
                        {"vmap": {"key": {"meta": {"key": "iifname"}}, "data": "@egress"}},
                    ],
                )
            )
        commands += [
            self._rule("to_host", [_REFUSED]),
            self._rule(
                REFUSE,
                [
                    _match({"meta": {"key": "l4proto"}}, "tcp"),
                    {"reject": {"type": "tcp reset"}},
                ],
            ),
            self._rule(REFUSE, [{"reject": {"type": "icmpx", "expr": "port-unreachable"}}]),
            self._rule(
                "postrouting",
                [
                    _match(_field("saddr"), _prefix(str(self.subnet))),
                    _match({"meta": {"key": "oifname"}}, PREFIX + "*", "!="),
                    {"masquerade": None},
                ],
            ),
        ]
        return commands

    def _over_connections(self) -> list[Any]:
        """A new connection of a sandbox that already has ``connections``: refused."""
        count = {"ct count": {"val": self.connections, "inv": True}}
        return [
            _match({"ct": {"key": "state"}}, "new", "in"),
            {"set": {"op": "add", "elem": _field("saddr"), "set": "@connections", "stmt": [count]}},
            _REFUSED,
        ]

    def _table(self) -> dict[str, Any]:
        return {"family": FAMILY, "name": self.table}

    def _in_table(self, name: str) -> dict[str, Any]:
        return {"family": FAMILY, "table": self.table, "name": name}

    def _chain(self, name: str) -> dict[str, Any]:
        return {"chain": self._in_table(name)}["chain"]

    def _base(self, name: str, kind: str, hook: str, priority: int) -> dict[str, Any]:
        return {
            "chain": {
                **self._in_table(name),
                "type": kind,
                "hook": hook,
                "prio": priority,
                "policy": "accept",
            }
        }["chain"]

    def _elements(self, name: str, elems: list[Any]) -> dict[str, Any]:
        return {**self._in_table(name), "elem": elems}

    def _rule(self, chain: str, expr: list[Any]) -> Command:
        return {
            "add": {"rule": {"family": FAMILY, "table": self.table, "chain": chain, "expr": expr}}
        }


def _match(left: Any, right: Any, op: str = "==") -> dict[str, Any]:
    return {"match": {"op": op, "left": left, "right": right}}


def _in_set(key: str, ref: str) -> dict[str, Any]:
    return _match({"meta": {"key": key}}, ref)


def _field(name: str) -> dict[str, Any]:
    return {"payload": {"protocol": "ip", "field": name}}


def _prefix(cidr: str) -> dict[str, Any]:
    network = ipaddress.ip_network(cidr)
    return {"prefix": {"addr": str(network.network_address), "len": network.prefixlen}}


def _daddr(cidr: str) -> dict[str, Any]:
    return _match(_field("daddr"), _prefix(cidr))


def _jump(chain: str) -> dict[str, Any]:
    return {"jump": {"target": chain}}


def _cidr(elem: Any) -> str:
    if isinstance(elem, dict) and "prefix" in elem:
        return f"{elem['prefix']['addr']}/{elem['prefix']['len']}"
    if isinstance(elem, dict) and "range" in elem:
        low, high = elem["range"]
        return str(
            next(
                ipaddress.summarize_address_range(
                    ipaddress.ip_address(low), ipaddress.ip_address(high)
                )
            )
        )
    return f"{elem}/32"

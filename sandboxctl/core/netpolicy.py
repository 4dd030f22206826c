"""A sandbox's egress policy and its agent's sandbox subnet, as values (no I/O).

e2b's rules, as this fleet enforces them on the host (see docs/network.md):

* ``internet`` False behaves as a deny of ``0.0.0.0/0``;
* ``allow_out`` (CIDRs and IPs) wins over ``deny_out`` (CIDRs and IPs);
* domain names are refused with an error naming the field: the filter matches addresses.

Whatever the policy says, a sandbox never reaches the host itself, another sandbox, or a
link-local (metadata) address: those rules come first and no ``allow_out`` opens them.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import msgspec

from sandboxctl.core.errors import InvalidValueError

ALL_TRAFFIC = "0.0.0.0/0"
MAX_RULES = 256  # per list: each becomes one element of an nftables set
# Never reachable from a sandbox, whatever its policy (the host's own addresses and the
# other sandboxes are matched by interface and route type, not listed here).
ALWAYS_BLOCKED = (
    "0.0.0.0/8",
    "127.0.0.0/8",
    "169.254.0.0/16",  # link-local, cloud metadata (169.254.169.254)
    "224.0.0.0/3",  # multicast and the reserved 240/4, broadcast included
)


class NetworkPolicy(msgspec.Struct, frozen=True):
    """What one sandbox may reach beyond what is always blocked, and whether its guest
    ports need the traffic access token (``public_traffic`` False).

    Checked when made (every target a CIDR or an IP, normalized; at most MAX_RULES per
    list), so a policy that exists is one the firewall can write. It is also the agent
    API's shape of a policy (``{"internet", "allow_out", "deny_out", "public_traffic"}``)."""

    internet: bool = False
    allow_out: tuple[str, ...] = ()
    deny_out: tuple[str, ...] = ()
    public_traffic: bool = True

    def __post_init__(self) -> None:
        for name, field in (("allow_out", "allowOut"), ("deny_out", "denyOut")):
            given = getattr(self, name)
            if given:
                msgspec.structs.force_setattr(self, name, targets(given, field))

    @property
    def egress(self) -> bool:
        """Whether any egress is possible: the sandbox gets DNS then."""
        return self.internet or bool(self.allow_out)

    @property
    def denied(self) -> tuple[str, ...]:
        """``deny_out`` with the deny-all that ``internet`` False stands for."""
        if self.internet or ALL_TRAFFIC in self.deny_out:
            return self.deny_out
        return (*self.deny_out, ALL_TRAFFIC)

    def updated(
        self, internet: object, allow_out: Sequence[str], deny_out: Sequence[str]
    ) -> NetworkPolicy:
        """This policy with its egress rules replaced (e2b's PUT replaces, never merges);
        ``internet`` that is not a bool (None, left out) keeps the current one.
        ``public_traffic`` is set at create only."""
        return NetworkPolicy(
            internet=internet if isinstance(internet, bool) else self.internet,
            allow_out=tuple(allow_out),
            deny_out=tuple(deny_out),
            public_traffic=self.public_traffic,
        )


def policy(
    internet: bool,
    allow_out: Iterable[str] = (),
    deny_out: Iterable[str] = (),
    public_traffic: bool = True,
) -> NetworkPolicy:
    """A policy from any iterables of targets (checked, as every policy is)."""
    return NetworkPolicy(internet, tuple(allow_out), tuple(deny_out), public_traffic)


def targets(values: Iterable[str], field: str) -> tuple[str, ...]:
    """CIDRs and IPv4 addresses, normalized (``8.8.8.8`` -> ``8.8.8.8/32``), in order,
    without repeats. A domain name, an IPv6 target or a malformed one is an error naming
    ``network.<field>``."""
    found: dict[str, None] = {}
    for value in values:
        if not isinstance(value, str):
            raise InvalidValueError(f"network.{field}: expected strings, got {value!r}")
        found[_normal(value, field)] = None
    if len(found) > MAX_RULES:
        raise InvalidValueError(f"network.{field}: at most {MAX_RULES} entries")
    return tuple(found)


@functools.lru_cache(maxsize=4096)
def _normal(value: str, field: str) -> str:
    """One target, normalized; cached, as every claim and every row read parses its
    policy again and policies repeat (an error is not cached: it raises)."""
    text = value.strip()
    try:
        network = ipaddress.ip_network(text, strict=False)
    except ValueError:
        if _looks_like_domain(text):
            raise InvalidValueError(
                f"network.{field}: {value!r} is a domain name; this fleet filters by "
                "address only: give CIDRs or IPs"
            ) from None
        raise InvalidValueError(
            f"network.{field}: {value!r} is not a CIDR or an IP address"
        ) from None
    if network.version != 4:
        raise InvalidValueError(
            f"network.{field}: {value!r}: sandboxes have no IPv6; give IPv4 CIDRs or IPs"
        )
    return str(network)


def _looks_like_domain(text: str) -> bool:
    labels = text.removeprefix("*.").split(".")
    return len(labels) > 1 and all(
        label and all(c.isalnum() or c == "-" for c in label) for label in labels
    )


# --- the agent's sandbox subnet -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SandboxSubnet:
    """One agent's sandbox addresses: the first host address is the gateway (and the
    DNS forwarder) every sandbox routes through; sandboxes get the next ones."""

    network: ipaddress.IPv4Network

    @property
    def gateway(self) -> str:
        return str(self.network.network_address + 1)

    @property
    def capacity(self) -> int:
        """Sandbox addresses: all but the network, gateway and broadcast addresses."""
        return max(0, self.network.num_addresses - 3)

    def address(self, index: int) -> str:
        """The ``index``-th sandbox address (0-based)."""
        if not 0 <= index < self.capacity:
            raise InvalidValueError(f"no sandbox address {index} in {self.network}")
        return str(self.network.network_address + 2 + index)

    def index_of(self, address: str) -> int | None:
        try:
            found = ipaddress.IPv4Address(address)
        except ValueError:
            return None
        index = int(found) - int(self.network.network_address) - 2
        return index if 0 <= index < self.capacity else None

    def __str__(self) -> str:
        return str(self.network)


def subnet(text: str, flag: str = "--sandbox-cidr") -> SandboxSubnet:
    """A sandbox subnet from ``A.B.C.D/N``: IPv4, from /8 to /29."""
    try:
        network = ipaddress.ip_network(text.strip(), strict=True)
    except ValueError as error:
        raise InvalidValueError(f"{flag} {text!r}: {error}") from None
    if not isinstance(network, ipaddress.IPv4Network) or not 8 <= network.prefixlen <= 29:
        raise InvalidValueError(f"{flag} {text!r}: expected an IPv4 CIDR from /8 to /29")
    return SandboxSubnet(network)


def first_free(
    candidates: Iterable[str], taken: Iterable[str], start: int = 0
) -> SandboxSubnet | None:
    """The first candidate CIDR (from position ``start``, wrapping) that overlaps none
    of ``taken`` (host routes and addresses, other agents' subnets)."""
    pool = [subnet(text) for text in candidates]
    used = [ipaddress.ip_network(text, strict=False) for text in taken]
    for offset in range(len(pool)):
        candidate = pool[(start + offset) % len(pool)]
        if not any(candidate.network.overlaps(other) for other in used if other.version == 4):
            return candidate
    return None


def overlapping(candidate: SandboxSubnet, taken: Iterable[str]) -> str | None:
    """The first of ``taken`` that overlaps the subnet, or None."""
    for text in taken:
        other = ipaddress.ip_network(text, strict=False)
        if other.version == 4 and candidate.network.overlaps(other):
            return text
    return None

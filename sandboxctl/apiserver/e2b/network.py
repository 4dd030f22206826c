"""e2b's network options, read into the agent contract's network policy.

Create (``network`` of ``POST /sandboxes``) and update (``PUT /sandboxes/{id}/network``)
bodies are read strictly: a field this fleet cannot honour is a 400 naming it, never
ignored (docs/network.md says what each one does here).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from sandboxctl.agentapi.network import NetworkUpdate
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.netpolicy import NetworkPolicy, policy, targets

# Upstream's default resolver list; this fleet refuses domain names in allowOut, where
# dnsServers takes effect, so it is checked and otherwise has no effect (as upstream's
# with no domain in allowOut).
DNS_SERVERS: Final = "dnsServers"
NOT_SERVED: Final = {
    "egressProxy": "egress through a SOCKS5 proxy is not served",
    "rules": "per-domain transform rules are not served",
    "maskRequestHost": "host masking is not served",
    "httpsPorts": "guest ports are relayed as plain HTTP",
}
CREATE_FIELDS: Final = frozenset({"allowOut", "denyOut", "allowPublicTraffic", DNS_SERVERS})
UPDATE_FIELDS: Final = frozenset({"allowOut", "denyOut", "allow_internet_access", DNS_SERVERS})


def create_policy(internet: bool, network: object) -> NetworkPolicy:
    """The policy of a new sandbox from ``allow_internet_access`` and ``network``."""
    body = _object(network, "network")
    _refuse(body, CREATE_FIELDS)
    public = body.get("allowPublicTraffic", True)
    if not isinstance(public, bool):
        raise InvalidValueError("network.allowPublicTraffic: expected true or false")
    return policy(
        internet,
        _list(body, "allowOut"),
        _list(body, "denyOut"),
        public_traffic=public,
    )


def update(body: Mapping[str, Any]) -> NetworkUpdate:
    """A ``PUT /sandboxes/{id}/network`` body: it replaces the egress rules (an omitted
    list clears them); ``allow_internet_access`` omitted keeps the current setting."""
    _refuse(body, UPDATE_FIELDS, where="")
    internet = body.get("allow_internet_access")
    if internet is not None and not isinstance(internet, bool):
        raise InvalidValueError("allow_internet_access: expected true or false")
    return NetworkUpdate(
        internet=internet,
        allow_out=targets(_list(body, "allowOut"), "allowOut"),
        deny_out=targets(_list(body, "denyOut"), "denyOut"),
    )


def network_body(value: NetworkPolicy) -> dict[str, Any]:
    """The ``network`` of a ``SandboxDetail``."""
    return {
        "allowOut": list(value.allow_out),
        "denyOut": list(value.deny_out),
        "allowPublicTraffic": value.public_traffic,
    }


def _object(value: object, name: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidValueError(f"{name}: expected an object")
    return value


def _refuse(body: Mapping[str, Any], known: frozenset[str], where: str = "network.") -> None:
    for name, value in body.items():
        if name in NOT_SERVED and value not in (None, [], {}, ""):
            raise InvalidValueError(f"{where}{name}: not supported: {NOT_SERVED[name]}")
        if name not in known and name not in NOT_SERVED:
            raise InvalidValueError(f"{where}{name}: not known to this server")
    servers = body.get(DNS_SERVERS)
    if servers is not None:
        for server in _list(body, DNS_SERVERS):
            if "/" in server or targets([server], DNS_SERVERS)[0] != f"{server}/32":
                raise InvalidValueError(f"network.{DNS_SERVERS}: {server!r} is not an IPv4")


def _list(body: Mapping[str, Any], name: str) -> list[str]:
    value = body.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise InvalidValueError(f"network.{name}: expected a list of strings")
    return value

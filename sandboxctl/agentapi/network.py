"""A sandbox's network policy on the agent API: in claims, rows and policy updates.

``{"internet": bool, "allow_out": [CIDR...], "deny_out": [CIDR...], "public_traffic": bool}``;
targets are checked and normalized by ``core.netpolicy`` (a domain name is a 400 naming
the field).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sandboxctl.agentapi.errors import AgentAnswerError
from sandboxctl.agentapi.fields import at, optional_list, read_object, refuse_unknown
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.netpolicy import NetworkPolicy, policy

POLICY_FIELDS = ("internet", "allow_out", "deny_out", "public_traffic")


def policy_from_json(value: object, path: str, strict: bool = True) -> NetworkPolicy:
    body = read_object(value, path)
    if strict:
        refuse_unknown(body, POLICY_FIELDS, path)
    try:
        return policy(
            internet=_bool(body.get("internet"), at(path, "internet"), False),
            allow_out=_strings(body.get("allow_out"), at(path, "allow_out")),
            deny_out=_strings(body.get("deny_out"), at(path, "deny_out")),
            public_traffic=_bool(body.get("public_traffic"), at(path, "public_traffic"), True),
        )
    except InvalidValueError as error:
        raise AgentAnswerError(path, str(error)) from None


def policy_json(value: NetworkPolicy) -> dict[str, Any]:
    return {
        "internet": value.internet,
        "allow_out": list(value.allow_out),
        "deny_out": list(value.deny_out),
        "public_traffic": value.public_traffic,
    }


@dataclass(frozen=True, slots=True)
class NetworkUpdate:
    """``PUT /v1/sandboxes/{id}/network``: the new egress rules, replacing the old ones;
    ``internet`` None keeps the current setting. ``public_traffic`` is set at claim only."""

    internet: bool | None = None
    allow_out: tuple[str, ...] = ()
    deny_out: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, value: object, path: str = "") -> NetworkUpdate:
        body = read_object(value, path)
        refuse_unknown(body, ("internet", "allow_out", "deny_out"), path)
        internet = body.get("internet")
        if internet is not None and not isinstance(internet, bool):
            raise AgentAnswerError(at(path, "internet"), "expected true or false")
        return cls(
            internet=internet,
            allow_out=_strings(body.get("allow_out"), at(path, "allow_out")),
            deny_out=_strings(body.get("deny_out"), at(path, "deny_out")),
        )

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"allow_out": list(self.allow_out), "deny_out": list(self.deny_out)}
        if self.internet is not None:
            body["internet"] = self.internet
        return body


def _bool(value: object, path: str, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise AgentAnswerError(path, "expected true or false")
    return value


def _strings(value: object, path: str) -> tuple[str, ...]:
    items = optional_list(value, path)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise AgentAnswerError(f"{path}[{i}]", "expected a string")
    return tuple(items)

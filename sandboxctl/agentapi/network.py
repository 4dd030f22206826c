"""A sandbox's network on the agent API, beyond the policy itself (``core.netpolicy``, the
shape claims and rows carry): the body of ``PUT /v1/sandboxes/{id}/network``."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from sandboxctl.agentapi.models import Request


class NetworkUpdate(Request, frozen=True):
    """``PUT /v1/sandboxes/{id}/network``: the new egress rules, replacing the old ones;
    ``internet`` left out keeps the current setting. ``public_traffic`` is set at claim
    only. The targets are checked when the agent applies them."""

    allow_out: tuple[str, ...] = ()
    deny_out: tuple[str, ...] = ()
    internet: bool | UnsetType = UNSET

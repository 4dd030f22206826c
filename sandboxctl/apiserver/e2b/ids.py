"""Sandbox ids as e2b clients see them: the DNS-safe spelling of a claim id.

A claim id such as ``sb_0123abcd`` is served as ``sb-0123abcd`` (lowercased, every
character outside ``[a-z0-9-]`` replaced by ``-``), so the SDK can put it in a host name.
Requests accept either spelling.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from threading import Lock
from typing import Final

_NOT_DNS: Final = re.compile(r"[^a-z0-9-]")


def public_id(claim_id: str) -> str:
    """The DNS-safe spelling of a claim id."""
    return _NOT_DNS.sub("-", claim_id.lower())


def claim_spelling(requested: str) -> str:
    """The agents' spelling of a public id: ``sb-0123abcd`` -> ``sb_0123abcd`` (agents
    name claims ``sb_`` + hex); any other id as given."""
    if requested.startswith("sb-"):
        return "sb_" + requested[3:]
    return requested


def same_sandbox(requested: str, claim_id: str) -> bool:
    """Whether a requested id names this claim: equal, or equal to its public spelling."""
    return requested == claim_id or public_id(claim_id) == public_id(requested)


class ClaimIds:
    """Remembers public id -> claim id for recently seen sandboxes (bounded), so a read
    right after a create can ask the owning node by its own spelling."""

    def __init__(self, capacity: int = 65536) -> None:
        self._ids: OrderedDict[str, str] = OrderedDict()
        self._capacity = capacity
        self._lock = Lock()

    def remember(self, claim_id: str) -> None:
        key = public_id(claim_id)
        if key == claim_id:
            return
        with self._lock:
            self._ids[key] = claim_id
            self._ids.move_to_end(key)
            while len(self._ids) > self._capacity:
                self._ids.popitem(last=False)

    def claim_id(self, requested: str) -> str:
        """The node-side spelling when known, else the agents' spelling of the id as
        requested: a replica that has not seen the sandbox asks the nodes with it."""
        with self._lock:
            return self._ids.get(public_id(requested), claim_spelling(requested))

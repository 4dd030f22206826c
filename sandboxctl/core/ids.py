"""A sandbox's id in its two spellings.

The agents name a claim ``sb_`` + hex (the claim id); e2b clients see the DNS-safe
spelling ``sb-…`` (lowercased, every character outside ``[a-z0-9-]`` replaced by ``-``),
so the SDK can put it in a host name. Requests may use either; two ids name the same
sandbox when their public spellings are equal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

_NOT_DNS: Final = re.compile(r"[^a-z0-9-]")


@dataclass(frozen=True, slots=True)
class SandboxId:
    """Equal, and hashed, by the public spelling; ``claim`` is the agents' spelling (the
    known one for an id read from an agent, else the usual mapping of what was given)."""

    public: str
    claim: str = field(compare=False)
    given: str = field(compare=False)

    @classmethod
    def parse(cls, text: str) -> SandboxId:
        """An id as a client gave it, in either spelling."""
        claim = "sb_" + text[3:] if text.startswith("sb-") else text
        return cls(public_id(text), claim, text)

    @classmethod
    def of_claim(cls, claim_id: str) -> SandboxId:
        """An id as an agent gave it."""
        return cls(public_id(claim_id), claim_id, claim_id)

    @property
    def spellings(self) -> tuple[str, ...]:
        """The spellings to ask an agent for, the agents' first."""
        return tuple(dict.fromkeys((self.claim, self.given)))

    def names(self, claim_id: str) -> bool:
        """Whether this id names the claim ``claim_id``."""
        return claim_id == self.claim or public_id(claim_id) == self.public

    def __str__(self) -> str:
        return self.public


def public_id(text: str) -> str:
    """The public spelling of an id in either spelling (``SandboxId(...).public``, without
    the object: lists and sorts take it for every sandbox)."""
    return _NOT_DNS.sub("-", text.lower())

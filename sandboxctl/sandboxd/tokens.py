"""Sandbox tokens: a new one for each claim, and those of claimed sandboxes that ended.

A claimed sandbox that ended (released, expired, died) keeps its token here for a while,
so its holder learns that it is gone (404, envd's "not found") rather than that the token
is wrong (401).
"""

from __future__ import annotations

import secrets
from collections import OrderedDict

ENDED_TOKENS = 4096  # tokens of claimed sandboxes that ended, kept for their holders


def new_token() -> str:
    return secrets.token_urlsafe(24)


class EndedTokens:
    """The newest ``keep`` of them. Not thread-safe: the agent calls it under its lock."""

    def __init__(self, keep: int = ENDED_TOKENS) -> None:
        self._keep = keep
        self._tokens: OrderedDict[str, str] = OrderedDict()

    def add(self, sandbox_id: str, token: str) -> None:
        self._tokens[sandbox_id] = token
        while len(self._tokens) > self._keep:
            self._tokens.popitem(last=False)

    def get(self, sandbox_id: str) -> str | None:
        return self._tokens.get(sandbox_id)

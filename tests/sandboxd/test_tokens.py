"""Tokens of ended sandboxes are kept for their holders, the newest ones only."""

from __future__ import annotations

from sandboxctl.sandboxd.tokens import EndedTokens, new_token


def test_the_oldest_ended_token_is_dropped_first() -> None:
    ended = EndedTokens(keep=2)
    for sandbox_id in ("sb_1", "sb_2", "sb_3"):
        ended.add(sandbox_id, f"token-{sandbox_id}")
    assert ended.get("sb_1") is None
    assert (ended.get("sb_2"), ended.get("sb_3")) == ("token-sb_2", "token-sb_3")


def test_tokens_are_unguessable_and_differ() -> None:
    tokens = {new_token() for _ in range(100)}
    assert len(tokens) == 100
    assert all(len(token) >= 32 for token in tokens)

"""A claim's rules written over netlink (``nftbatch``) are the ones nft itself writes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from sandboxctl.sandboxd.network.firewall import _daddr
from sandboxctl.sandboxd.network.nft import Nft, NftError
from sandboxctl.sandboxd.network.nftbatch import ChainWriter, Rule

RULES = [
    Rule("accept", "10.200.7.1/32"),
    Rule("accept", "198.51.100.7/32"),
    Rule("accept", "198.51.100.0/24"),
    Rule("drop", "203.0.113.8/29"),
    Rule("drop", "10.0.0.0/8"),
    Rule("return", "192.0.2.0/24"),
    Rule("accept", "0.0.0.0/0"),
    Rule("drop"),
]


@pytest.fixture
def table() -> Iterator[str]:
    """A scratch table with chains ``ours`` and ``nfts``, gone afterwards."""
    nft = Nft()
    name = f"nftbatch_test_{os.getpid()}"
    ref = {"family": "inet", "name": name}
    nft.run([{"add": {"table": ref}}, {"delete": {"table": ref}}, {"add": {"table": ref}}])
    for chain in ("ours", "nfts"):
        nft.run([{"add": {"chain": {"family": "inet", "table": name, "name": chain}}}])
    yield name
    nft.run([{"delete": {"table": ref}}])


def listed(table: str, chain: str) -> list[list[Any]]:
    found = Nft().list({"chain": {"family": "inet", "table": table, "name": chain}})
    return [item["rule"]["expr"] for item in found if "rule" in item]


def test_the_rules_read_back_as_nft_writes_them(table: str) -> None:
    nft_rules = []
    for rule in RULES:  # as the firewall has libnftables write them on a table rebuild
        expr: list[Any] = [_daddr(rule.prefix)] if rule.prefix is not None else []
        expr.append({rule.verdict: None})
        nft_rules.append(
            {"add": {"rule": {"family": "inet", "table": table, "chain": "nfts", "expr": expr}}}
        )
    Nft().run(nft_rules)
    writer = ChainWriter("inet", table)
    try:
        writer.replace("ours", RULES[:2])
        writer.replace("ours", RULES)  # replaces, does not append
        assert listed(table, "ours") == listed(table, "nfts")
        assert len(listed(table, "ours")) == len(RULES)
    finally:
        writer.close()


def test_a_missing_chain_is_an_error_and_changes_nothing(table: str) -> None:
    writer = ChainWriter("inet", table)
    try:
        writer.replace("ours", RULES)
        before = listed(table, "ours")
        with pytest.raises(NftError, match="No such file or directory"):
            writer.replace("gone", RULES)
        assert listed(table, "ours") == before
        writer.replace("ours", [])  # the socket is still good: an empty chain
        assert listed(table, "ours") == []
    finally:
        writer.close()

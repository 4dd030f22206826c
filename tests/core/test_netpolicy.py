from __future__ import annotations

import pytest

from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.netpolicy import (
    NetworkPolicy,
    first_free,
    overlapping,
    policy,
    subnet,
    targets,
)


def test_targets_are_normalized_cidrs_in_order_without_repeats() -> None:
    assert targets(["8.8.8.8", " 10.0.0.0/8 ", "8.8.8.8/32", "192.0.2.7/24"], "allowOut") == (
        "8.8.8.8/32",
        "10.0.0.0/8",
        "192.0.2.0/24",
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("example.com", r"network\.allowOut: 'example\.com' is a domain name"),
        ("*.example.com", "is a domain name"),
        ("2001:db8::/32", "no IPv6"),
        ("10.0.0.0/33", "not a CIDR or an IP"),
        ("", "not a CIDR or an IP"),
    ],
)
def test_bad_targets_name_the_field(value: str, message: str) -> None:
    with pytest.raises(InvalidValueError, match=message):
        targets([value], "allowOut")


def test_no_internet_denies_everything_that_allow_out_does_not_open() -> None:
    assert policy(False).denied == ("0.0.0.0/0",)
    assert policy(False, allow_out=["1.1.1.1"]).allow_out == ("1.1.1.1/32",)
    assert policy(True, deny_out=["10.0.0.0/8"]).denied == ("10.0.0.0/8",)
    assert policy(False, deny_out=["0.0.0.0/0"]).denied == ("0.0.0.0/0",)


def test_an_update_replaces_the_rules_and_keeps_public_traffic() -> None:
    before = NetworkPolicy(True, ("1.1.1.1/32",), ("10.0.0.0/8",), public_traffic=False)
    after = before.updated(None, ["2.2.2.2"], [])
    assert after == NetworkPolicy(True, ("2.2.2.2/32",), (), public_traffic=False)
    assert before.updated(False, [], []).internet is False


def test_a_subnet_has_a_gateway_and_sandbox_addresses() -> None:
    net = subnet("10.200.7.0/24")
    assert net.gateway == "10.200.7.1"
    assert net.capacity == 253
    assert net.address(0) == "10.200.7.2"
    assert net.index_of("10.200.7.254") == 252
    assert net.index_of("10.200.8.2") is None
    with pytest.raises(InvalidValueError, match="/8 to /29"):
        subnet("10.0.0.0/30")
    with pytest.raises(InvalidValueError, match="--sandbox-cidr"):
        subnet("10.200.7.1/24")  # host bits set


def test_the_first_free_subnet_skips_what_the_host_routes() -> None:
    candidates = [f"10.200.{n}.0/24" for n in range(4)]
    taken = ["10.200.1.0/24", "10.200.2.7/32", "192.0.2.0/24"]
    assert str(first_free(candidates, taken, start=1)) == "10.200.3.0/24"
    assert first_free(candidates[1:3], taken) is None
    assert overlapping(subnet("192.0.2.0/25"), taken) == "192.0.2.0/24"

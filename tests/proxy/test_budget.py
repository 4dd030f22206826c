"""The probe budget, with an injected clock, and routing."""

from __future__ import annotations

import pytest

from sandboxctl.clock import ManualClock
from sandboxctl.proxy import TokenBucket
from sandboxctl.proxy.routing import BadRoute, Target, is_internal, route


def test_bucket_starts_full_spends_the_burst_then_refills_at_the_rate(clock: ManualClock) -> None:
    bucket = TokenBucket(200, 400, clock.monotonic)
    assert all(bucket.take() for _ in range(400))
    assert not bucket.take()  # over budget
    clock.advance(0.004)  # 0.8 of a token
    assert not bucket.take()
    clock.advance(0.001)  # 1.0
    assert bucket.take()
    assert not bucket.take()
    clock.advance(1.0)  # 200 more
    assert sum(bucket.take() for _ in range(500)) == 200


def test_bucket_never_banks_more_than_the_burst(clock: ManualClock) -> None:
    bucket = TokenBucket(200, 400, clock.monotonic)
    clock.advance(3600)
    assert sum(bucket.take() for _ in range(1000)) == 400


def test_bucket_ignores_a_clock_going_backwards(clock: ManualClock) -> None:
    bucket = TokenBucket(1, 1, clock.monotonic)
    assert bucket.take()
    clock.advance(-50)
    assert not bucket.take()
    clock.advance(1)
    assert bucket.take()


def test_routing() -> None:
    domain = "sandboxes.test"
    assert route({"host": "49983-sb-0123abcd.sandboxes.test:3001"}, domain) == Target(
        "sb-0123abcd", 49983
    )
    assert route({"host": "49983-SB-0123.Sandboxes.Test"}, domain) == Target("sb-0123", 49983)
    headers = {
        "e2b-sandbox-id": "sb-x",
        "e2b-sandbox-port": "49999",
        "host": "1-sb-y.sandboxes.test",
    }
    assert route(headers, domain) == Target("sb-x", 49999)
    assert route({"e2b-sandbox-id": "", "host": "127.0.0.1:3001"}, domain) is None
    assert route({"host": "a.b.sandboxes.test"}, domain) is None
    assert route({"host": "sandboxes.test"}, domain) is None
    assert route({"host": "49983.sandboxes.test"}, domain) is None
    for port in ("", "+1", "-1", "0", "65536", "4998a", " 1 2"):
        with pytest.raises(BadRoute):
            route({"e2b-sandbox-id": "sb-x", "e2b-sandbox-port": port}, domain)
    with pytest.raises(BadRoute):
        route({"host": "x9-sb-1.sandboxes.test"}, domain)
    for path in ("/init", "/INIT", "/freeze/", " /fsThaw", "/collapse", "/unfreeze", "/fsfreeze"):
        assert is_internal(path), path
    assert not is_internal("/files")
    assert not is_internal("/initx")

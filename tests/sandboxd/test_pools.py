"""The warm pools' bookkeeping, without sandboxes: which pool refills first, what drains,
what a cold claim may give up, and the refill loop's retry."""

from __future__ import annotations

import threading

import pytest

from sandboxctl.core.model import PoolKey
from sandboxctl.lifecycle import Stop
from sandboxctl.sandboxd.errors import BadRequest, UnknownTemplate
from sandboxctl.sandboxd.pools import WarmPools, check_targets
from sandboxctl.sandboxd.templates.catalog import Catalog

BASE = PoolKey("base")
LARGE = PoolKey("base", size="large")


def _pools() -> WarmPools:
    return WarmPools(refill_once=lambda: 0)


def test_the_pool_furthest_below_its_target_refills_first() -> None:
    pools = _pools()
    pools.set_targets({BASE: 2, LARGE: 3})
    pools.add(LARGE, "sb_1")
    assert pools.next_refill() == LARGE  # 2 short, against BASE's 2: the key breaks the tie
    pools.begin_start(LARGE)
    assert pools.next_refill() == BASE
    pools.add(BASE, "sb_2")
    pools.add(BASE, "sb_3")
    assert pools.next_refill() == LARGE
    pools.add(LARGE, "sb_4")
    assert pools.next_refill() is None  # the start in progress counts
    pools.end_start(LARGE)
    assert pools.next_refill() == LARGE
    assert pools.starting() == 0


def test_what_exceeds_a_target_drains_newest_first_and_a_pool_left_out_drains_whole() -> None:
    pools = _pools()
    for sandbox_id in ("sb_1", "sb_2", "sb_3"):
        pools.add(BASE, sandbox_id)
    pools.add(LARGE, "sb_4")
    pools.set_targets({BASE: 1, LARGE: 0})
    assert sorted(pools.pop_excess()) == ["sb_2", "sb_3", "sb_4"]
    assert pools.warm(BASE) == ["sb_1"]
    assert [(s.key, s.warm, s.target) for s in pools.status()] == [(BASE, 1, 1)]


def test_a_claim_takes_the_oldest_and_room_is_made_from_the_newest() -> None:
    pools = _pools()
    for sandbox_id in ("sb_1", "sb_2", "sb_3"):
        pools.add(BASE, sandbox_id)
    assert pools.pop_oldest(BASE) == "sb_1"
    assert pools.pop_any() == "sb_3"
    pools.discard(BASE, "sb_2")
    assert pools.pop_oldest(BASE) is None
    assert pools.pop_any() is None


def test_a_failed_refill_is_tried_again_until_the_loop_stops() -> None:
    calls: list[int] = []
    stopping = Stop()

    def refill_once() -> int:
        calls.append(1)
        if len(calls) >= 2:
            stopping.set()
        raise RuntimeError("a start failed")

    pools = WarmPools(refill_once)
    pools.wanted.set()
    loop = threading.Thread(target=pools.run, args=(stopping,), daemon=True)
    loop.start()
    loop.join(timeout=10)
    assert not loop.is_alive()
    assert len(calls) == 2  # the first failure asked for a second try, after a pause


def test_the_refill_loop_ends_when_stopping_even_while_nothing_is_wanted() -> None:
    stopping = Stop()
    pools = _pools()
    loop = threading.Thread(target=pools.run, args=(stopping,), daemon=True)
    loop.start()
    stopping.set()  # wakes the loop itself (a manager's stop knows nothing of wanted)
    loop.join(timeout=10)
    assert not loop.is_alive()


@pytest.mark.parametrize(
    ("targets", "error", "message"),
    [
        ({PoolKey("nope"): 1}, UnknownTemplate, "not served"),
        ({PoolKey("base", net="egress"): 1}, BadRequest, "net is not a pool dimension"),
        ({PoolKey("base", size="huge"): 1}, BadRequest, "size: must be one of"),
        ({BASE: -1}, BadRequest, "must not be negative"),
    ],
)
def test_targets_are_checked(
    targets: dict[PoolKey, int], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        check_targets(targets, Catalog({}))

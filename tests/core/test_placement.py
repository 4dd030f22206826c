"""Placement by the power of two choices with injected randomness."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pytest

from sandboxctl.core.errors import SandboxctlError
from sandboxctl.core.model import Entry, NodeInventory, Pool, PoolKey
from sandboxctl.core.placement import (
    ColdCandidate,
    Delivered,
    Failed,
    NoNodeCapacity,
    NoWarmCapacity,
    Outcome,
    Undelivered,
    cold_candidates,
    pick_candidate,
    place,
    place_cold,
    serves,
)
from sandboxctl.core.snapshot import WarmCandidate


class Script:
    """A pick that returns scripted indexes and records the ``n`` it was asked about."""

    def __init__(self, *indexes: int) -> None:
        self._indexes = list(indexes)
        self.asked: list[int] = []

    def __call__(self, n: int) -> int:
        self.asked.append(n)
        return self._indexes.pop(0)

    @property
    def exhausted(self) -> bool:
        return not self._indexes


def cand(node: str, warm: int = 1) -> WarmCandidate:
    return WarmCandidate(node, f"{node}:7777", warm)


def by_node(
    outcomes: dict[str, Outcome[str]],
) -> tuple[Callable[[WarmCandidate], Outcome[str]], list[str]]:
    """An attempt answering per node, and the list of nodes it was called for."""
    calls: list[str] = []

    def attempt(candidate: WarmCandidate) -> Outcome[str]:
        calls.append(candidate.node)
        return outcomes.get(candidate.node, Delivered(f"claimed on {candidate.node}"))

    return attempt, calls


# --- one pick -----------------------------------------------------------------------------------


def test_the_warmer_of_the_two_wins_when_it_is_drawn_second() -> None:
    candidates = [cand("a", 1), cand("b", 3)]
    assert pick_candidate(candidates, Script(0, 1)).node == "b"


def test_the_warmer_of_the_two_wins_when_it_is_drawn_first() -> None:
    candidates = [cand("a", 1), cand("b", 3)]
    assert pick_candidate(candidates, Script(1, 0)).node == "b"


def test_equal_warmth_keeps_the_first_pick() -> None:
    candidates = [cand("a", 2), cand("b", 2)]
    assert pick_candidate(candidates, Script(1, 0)).node == "b"
    assert pick_candidate(candidates, Script(0, 1)).node == "a"


def test_two_independent_picks_with_replacement() -> None:
    pick = Script(2, 2)
    candidates = [cand("a", 9), cand("b", 9), cand("c", 1)]
    assert pick_candidate(candidates, pick).node == "c"  # the same draw twice is allowed
    assert pick.asked == [3, 3]


def test_a_single_candidate_is_drawn_twice_and_chosen() -> None:
    pick = Script(0, 0)
    assert pick_candidate([cand("only")], pick).node == "only"
    assert pick.asked == [1, 1]


def test_no_candidates_is_no_warm_capacity() -> None:
    with pytest.raises(NoWarmCapacity):
        pick_candidate([], Script())


@pytest.mark.parametrize("bad", [-1, 2, 5])
def test_a_pick_outside_the_range_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match=r"outside \[0, 2\)"):
        pick_candidate([cand("a"), cand("b")], Script(bad, 0))


# --- placing ------------------------------------------------------------------------------------


def test_a_delivered_attempt_returns_its_candidate_and_result() -> None:
    attempt, calls = by_node({})
    chosen, result = place([cand("a", 1), cand("b", 2)], attempt, Script(0, 1))
    assert chosen == cand("b", 2)
    assert result == "claimed on b"
    assert calls == ["b"]


def test_an_undelivered_node_is_removed_with_all_its_candidates_and_picked_again() -> None:
    # Node "a" holds two candidates (two matching pools); refusing removes both at once.
    candidates = [cand("a", 5), cand("b", 1), cand("a", 4), cand("c", 1)]
    attempt, calls = by_node({"a": Undelivered("429")})
    pick = Script(0, 0, 1, 0)
    chosen, result = place(candidates, attempt, pick)
    assert calls == ["a", "c"]
    assert pick.asked == [4, 4, 2, 2]  # after the refusal only b and c remain
    assert (chosen.node, result) == ("c", "claimed on c")
    assert pick.exhausted


def test_undelivered_also_drops_the_nodes_it_names() -> None:
    candidates = [cand("a"), cand("b"), cand("c")]
    attempt, calls = by_node({"a": Undelivered("redirect not taken", also=("b",))})
    pick = Script(0, 0, 0, 0)
    chosen, _ = place(candidates, attempt, pick)
    assert calls == ["a", "c"]
    assert pick.asked == [3, 3, 1, 1]
    assert chosen.node == "c"


def test_a_failed_attempt_is_raised_without_retry() -> None:
    timeout = TimeoutError("claim sent, no reply within 10s")
    attempt, calls = by_node({"a": Failed(timeout)})
    pick = Script(0, 0, 1, 1)
    with pytest.raises(TimeoutError) as raised:
        place([cand("a"), cand("b")], attempt, pick)
    assert raised.value is timeout
    assert calls == ["a"]
    assert pick.asked == [2, 2]


def test_exhaustion_raises_no_warm_capacity_naming_the_nodes_tried() -> None:
    attempt, calls = by_node({n: Undelivered("503") for n in "abc"})
    with pytest.raises(NoWarmCapacity) as raised:
        place([cand("a"), cand("b"), cand("c")], attempt, Script(1, 1, 0, 0, 0, 0))
    assert calls == ["b", "a", "c"]
    assert raised.value.tried == ("b", "a", "c")
    assert "b, a, c" in str(raised.value)


def test_no_candidates_at_all_raises_no_warm_capacity_without_an_attempt() -> None:
    attempt, calls = by_node({})
    with pytest.raises(NoWarmCapacity) as raised:
        place([], attempt, Script())
    assert calls == []
    assert raised.value.tried == ()
    assert isinstance(raised.value, SandboxctlError)


def test_place_does_not_change_the_callers_candidates() -> None:
    candidates = [cand("a"), cand("b")]
    attempt, _ = by_node({"a": Undelivered()})
    place(candidates, attempt, Script(0, 0, 0, 0))
    assert candidates == [cand("a"), cand("b")]


# --- the distribution ---------------------------------------------------------------------------


def test_power_of_two_favours_a_warm_node_without_always_choosing_it() -> None:
    nodes = [cand("hot", 5)] + [cand(f"cold-{i}", 1) for i in range(9)]
    rng = random.Random(20260927)
    picks = 10_000
    counts = Counter(pick_candidate(nodes, rng.randrange).node for _ in range(picks))
    share = counts["hot"] / picks
    uniform = 1 / len(nodes)  # 0.10
    expected = 1 - (1 - uniform) ** 2  # 0.19: the hot node wins if either draw hits it
    assert share > uniform * 1.5
    assert share < 0.5  # greedy would choose it every time
    assert share == pytest.approx(expected, abs=0.02)
    assert len(counts) == len(nodes)  # every cold node still gets claims


def test_place_with_a_seeded_random_is_reproducible() -> None:
    nodes = [cand(f"n{i}", i % 3 + 1) for i in range(8)]
    attempt, _ = by_node({"n2": Undelivered(), "n5": Undelivered()})

    def run(seed: int) -> list[str]:
        rng = random.Random(seed)
        return [place(nodes, attempt, rng.randrange)[0].node for _ in range(50)]

    assert run(7) == run(7)
    assert not {"n2", "n5"} & set(run(7))


# --- cold starts ----------------------------------------------------------------------------------


def inventory(
    node: str,
    capacity: int | None,
    claimed: int = 0,
    templates: tuple[str, ...] = ("base",),
    address: str = "",
) -> tuple[str, NodeInventory]:
    entries = tuple(Entry(name=f"default/s{i}", phase="Running") for i in range(claimed))
    return node, NodeInventory(
        node=node,
        address=address or f"{node}:7777",
        templates=tuple({"template": t} for t in templates),
        entries=entries,
        capacity=capacity,
    )


def test_cold_candidates_put_the_most_free_slots_first_and_skip_full_or_foreign_nodes() -> None:
    inventories = [
        inventory("a", 4, claimed=3),
        inventory("b", 8, claimed=2),
        inventory("c", 2, claimed=2),  # full
        inventory("d", 9, templates=("py",)),  # does not serve base
        inventory("e", None),  # says nothing of its capacity: asked last
        inventory("f", 9),
        inventory("g", 7, claimed=1),
    ]
    inventories[5] = ("f", NodeInventory(node="f", templates=({"template": "base"},)))  # no address
    found = cold_candidates(inventories, PoolKey("base"))
    assert [(c.node, c.free) for c in found] == [("b", 6), ("g", 6), ("a", 1), ("e", None)]


def test_a_pool_of_the_template_counts_as_serving_it() -> None:
    _, node = inventory("a", 2, templates=())
    pooled = NodeInventory(node="a", address="a:7777", pools=(Pool(PoolKey("py"), 0, 1),))
    assert not serves(node, "py")
    assert serves(pooled, "py")


def test_place_cold_tries_in_order_until_one_delivers() -> None:
    candidates = cold_candidates([inventory("a", 2), inventory("b", 5)], PoolKey("base"))
    calls: list[str] = []

    def attempt(candidate: ColdCandidate) -> Outcome[str]:
        calls.append(candidate.node)
        return Undelivered("429") if candidate.node == "b" else Delivered("on a")

    chosen, result = place_cold("base", candidates, attempt)
    assert (chosen.node, result, calls) == ("a", "on a", ["b", "a"])


def test_place_cold_with_every_node_refusing_is_no_node_capacity() -> None:
    candidates = cold_candidates([inventory("a", 2), inventory("b", 5)], PoolKey("base"))
    with pytest.raises(NoNodeCapacity) as raised:
        place_cold("base", candidates, lambda c: Undelivered("429"))
    assert raised.value.tried == ("b", "a")
    assert "every node that serves template 'base' is full (tried b, a)" in str(raised.value)
    with pytest.raises(NoNodeCapacity) as none:
        place_cold("base", [], lambda c: Delivered("never"))
    assert none.value.tried == ()


def test_place_cold_raises_a_failed_attempt_at_once() -> None:
    candidates = cold_candidates([inventory("a", 2), inventory("b", 5)], PoolKey("base"))
    boom = SandboxctlError("timed out after sending")
    calls: list[str] = []

    def attempt(candidate: ColdCandidate) -> Outcome[str]:
        calls.append(candidate.node)
        return Failed(boom)

    with pytest.raises(SandboxctlError) as raised:
        place_cold("base", candidates, attempt)
    assert raised.value is boom
    assert calls == ["b"]

"""The warm-pool spread: even by node name, sums per key, full sets, and the status."""

from __future__ import annotations

from sandboxctl.core.model import PoolKey
from sandboxctl.core.warmpools import WarmPoolSpec, pool_status, spread

BASE = PoolKey("base")
PY = PoolKey("python", "egress", "medium")


def spec(name: str, key: PoolKey | None, replicas: int) -> WarmPoolSpec:
    return WarmPoolSpec("default", name, key, replicas)


def test_even_spread_the_first_nodes_take_the_remainder() -> None:
    plan = spread([spec("p", BASE, 5)], ["c", "a", "b"])
    assert plan == {"a": ((BASE, 2),), "b": ((BASE, 2),), "c": ((BASE, 1),)}


def test_pools_of_one_key_are_summed_and_sets_are_sorted() -> None:
    plan = spread([spec("p", PY, 2), spec("q", BASE, 1), spec("r", BASE, 2)], ["a", "b"])
    assert plan == {"a": ((BASE, 2), (PY, 1)), "b": ((BASE, 1), (PY, 1))}


def test_unresolved_or_empty_pools_leave_empty_sets_that_drain() -> None:
    plan = spread([spec("p", None, 3), spec("q", BASE, 0)], ["a"])
    assert plan == {"a": ()}
    assert spread([spec("p", BASE, 3)], []) == {}


def test_status_counts_the_keys_warm_sandboxes() -> None:
    warm = {"a": {BASE: 2, PY: 1}, "b": {BASE: 1}}
    assert pool_status(spec("p", BASE, 3), warm) == {
        "replicas": 3,
        "readyReplicas": 3,
        "selector": "agents.x-k8s.io/warm-pool=p",
    }
    assert pool_status(spec("x", None, 3), warm)["readyReplicas"] == 0

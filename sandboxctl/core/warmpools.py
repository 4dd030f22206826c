"""The warm-pool driver's rule: SandboxWarmPool replicas spread over the fresh nodes.

Each pool's ``replicas`` is spread evenly over the nodes in name order: every node gets
``replicas // n`` and the first ``replicas % n`` one more. Pools that resolve to the same
key on a node are summed (an agent takes each key once). Every node gets its whole set,
sorted, so a pool missing from it is drained there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sandboxctl.core.model import PoolKey

WARM_POOL_LABEL = "agents.x-k8s.io/warm-pool"


@dataclass(frozen=True, slots=True)
class WarmPoolSpec:
    """One SandboxWarmPool as the driver reads it; ``key`` is None when its template
    cannot be resolved (the pool is skipped, and reports 0)."""

    namespace: str
    name: str
    key: PoolKey | None
    replicas: int


def spread(
    specs: Iterable[WarmPoolSpec], nodes: Sequence[str]
) -> dict[str, tuple[tuple[PoolKey, int], ...]]:
    """Node -> its full desired set of (key, warm), sorted by key; every node appears."""
    ordered = sorted(nodes)
    wanted: dict[str, dict[PoolKey, int]] = {node: {} for node in ordered}
    if ordered:
        for spec in specs:
            if spec.key is None or spec.replicas <= 0:
                continue
            base, extra = divmod(spec.replicas, len(ordered))
            for index, node in enumerate(ordered):
                count = base + (1 if index < extra else 0)
                if count:
                    wanted[node][spec.key] = wanted[node].get(spec.key, 0) + count
    return {node: tuple(sorted(pools.items())) for node, pools in wanted.items()}


def pool_status(
    spec: WarmPoolSpec, warm_by_node: Mapping[str, Mapping[PoolKey, int]]
) -> dict[str, object]:
    """A pool's status: ready = warm sandboxes of its key over the nodes."""
    ready = 0
    if spec.key is not None:
        ready = sum(pools.get(spec.key, 0) for pools in warm_by_node.values())
    return {
        "replicas": ready,
        "readyReplicas": ready,
        "selector": f"{WARM_POOL_LABEL}={spec.name}",
    }

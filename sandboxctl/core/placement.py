"""Placement of a claim on a warm node by the power of two choices.

Inventory is seconds stale, so always picking the warmest node would send a burst of
claims to one node. Instead each pick draws two candidates uniformly (with replacement)
and takes the second only if it is strictly warmer: warmer nodes are favoured without
being chosen every time.

:func:`place` tries picks until one delivers. A node that did not take the claim
(:class:`Undelivered`: 429, a refused dial, a 5xx, a redirect nobody took) is dropped with
all its candidates and the pick is drawn again; a :class:`Failed` attempt (for example a
timeout after the request was sent, which may have delivered) is raised as is and never
retried. Randomness is injected: ``pick(n)`` returns a uniform index in ``[0, n)``, such as
``random.Random(seed).randrange``.

When no warm candidate takes the claim, :func:`place_cold` starts one cold: on the node
that serves the template with the most free claim slots (:func:`cold_candidates`), then
the next, until one delivers. When every node is full that is :class:`NoNodeCapacity`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeAlias, TypeVar

from sandboxctl.core.errors import SandboxctlError
from sandboxctl.core.model import NodeInventory, PoolKey
from sandboxctl.core.snapshot import WarmCandidate

T = TypeVar("T")

Pick: TypeAlias = Callable[[int], int]


class NoWarmCapacity(SandboxctlError):
    """No candidate node can take the claim: there were none, or every one refused it.

    ``tried`` names the nodes that were asked and did not deliver, in the order asked.
    Both APIs answer it with 503.
    """

    def __init__(self, tried: Sequence[str] = ()) -> None:
        self.tried = tuple(tried)
        if self.tried:
            message = f"no warm capacity: no node took the claim (tried {', '.join(self.tried)})"
        else:
            message = "no warm capacity: no fresh node with an address has a warm sandbox"
        super().__init__(message)


class NoNodeCapacity(SandboxctlError):
    """Every fresh node that serves the template is full: no cold start either.

    ``tried`` names the nodes that were asked and refused, in the order asked. Both APIs
    answer it with 429.
    """

    def __init__(self, template: str, tried: Sequence[str] = ()) -> None:
        self.tried = tuple(tried)
        where = f" (tried {', '.join(self.tried)})" if self.tried else ""
        super().__init__(
            f"no capacity: every node that serves template {template!r} is full{where}"
        )


@dataclass(frozen=True, slots=True)
class ColdCandidate:
    """A node that may start a sandbox cold: ``free`` claim slots by its inventory
    (capacity less claims); None when it does not report a capacity."""

    node: str
    address: str
    free: int | None


@dataclass(frozen=True, slots=True)
class Delivered(Generic[T]):
    """The node took the claim; ``result`` is what the attempt produced (the assignment)."""

    result: T


@dataclass(frozen=True, slots=True)
class Undelivered:
    """The node certainly did not take the claim, so another node may be asked.

    ``also`` names further nodes to drop with it (the targets of a redirect that failed).
    """

    reason: str = ""
    also: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Failed:
    """The claim failed in a way that must not be retried; ``error`` is raised as is."""

    error: Exception


Outcome: TypeAlias = Delivered[T] | Undelivered | Failed


def pick_candidate(candidates: Sequence[WarmCandidate], pick: Pick) -> WarmCandidate:
    """Two independent uniform picks; the second wins only if strictly warmer."""
    if not candidates:
        raise NoWarmCapacity()
    first = candidates[_index(pick, len(candidates))]
    second = candidates[_index(pick, len(candidates))]
    return second if second.warm > first.warm else first


def place(
    candidates: Sequence[WarmCandidate],
    attempt: Callable[[WarmCandidate], Outcome[T]],
    pick: Pick,
) -> tuple[WarmCandidate, T]:
    """Pick and attempt until a node delivers; return that candidate and the result.

    Raises the error of a :class:`Failed` attempt, and :class:`NoWarmCapacity` when the
    candidates run out.
    """
    remaining = list(candidates)
    tried: list[str] = []
    while remaining:
        chosen = pick_candidate(remaining, pick)
        outcome = attempt(chosen)
        if isinstance(outcome, Delivered):
            return chosen, outcome.result
        if isinstance(outcome, Failed):
            raise outcome.error
        tried.append(chosen.node)
        dropped = {chosen.node, *outcome.also}
        remaining = [c for c in remaining if c.node not in dropped]
    raise NoWarmCapacity(tried)


def _index(pick: Pick, n: int) -> int:
    index = pick(n)
    if not 0 <= index < n:
        raise ValueError(f"pick({n}) returned {index}, outside [0, {n})")
    return index


def cold_candidates(
    inventories: Iterable[tuple[str, NodeInventory]], key: PoolKey
) -> list[ColdCandidate]:
    """The nodes that may start ``key`` cold, most free slots first (then by name): each
    with an address that serves the template (it lists it, or has a pool of it) and has a
    slot free, or reports no capacity (the node decides)."""
    found = []
    for node, inventory in inventories:
        if not inventory.address or not serves(inventory, key.template):
            continue
        free = None
        if inventory.capacity is not None:
            free = inventory.capacity - len(inventory.entries)
            if free <= 0:
                continue
        found.append(ColdCandidate(node, inventory.address, free))
    return sorted(found, key=lambda c: (-(c.free if c.free is not None else 0), c.node))


def serves(inventory: NodeInventory, template: str) -> bool:
    """Whether a node serves ``template``: it lists it, or has a pool of it."""
    return any(t.get("template") == template for t in inventory.templates) or any(
        pool.key.template == template for pool in inventory.pools
    )


def place_cold(
    template: str,
    candidates: Sequence[ColdCandidate],
    attempt: Callable[[ColdCandidate], Outcome[T]],
) -> tuple[ColdCandidate, T]:
    """Attempt the candidates in order until one delivers; raise the error of a
    :class:`Failed` attempt, and :class:`NoNodeCapacity` when none is left."""
    tried: list[str] = []
    dropped: set[str] = set()
    for candidate in candidates:
        if candidate.node in dropped:
            continue
        outcome = attempt(candidate)
        if isinstance(outcome, Delivered):
            return candidate, outcome.result
        if isinstance(outcome, Failed):
            raise outcome.error
        tried.append(candidate.node)
        dropped.update((candidate.node, *outcome.also))
    raise NoNodeCapacity(template, tried)

"""The one interface every reader of the fleet goes through."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from sandboxctl.core.snapshot import FleetSnapshot


@runtime_checkable
class InventorySource(Protocol):
    """Serves the current fleet snapshot.

    ``snapshot()`` never blocks on the network: a backend refreshes in the background and
    swaps in a new immutable snapshot, so a partitioned node can only make its own entry
    old, never make a read wait. Freshness is applied by the reader through
    :meth:`FleetSnapshot.view`, with the same rule on every binary.
    """

    def snapshot(self) -> FleetSnapshot: ...

"""The one interface every reader of the fleet goes through."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from sandboxctl.core.snapshot import FleetSnapshot

log = logging.getLogger("sandboxctl.inventory")

Listener = Callable[[], None]


@runtime_checkable
class InventorySource(Protocol):
    """Serves the current fleet snapshot.

    ``snapshot()`` never blocks on the network: a backend refreshes in the background and
    swaps in a new immutable snapshot, so a partitioned node can only make its own entry
    old, never make a read wait. Freshness is applied by the reader through
    :meth:`FleetSnapshot.view`, with the same rule on every binary.

    ``subscribe(listener)`` calls ``listener`` (from the thread that swapped it in) after
    each new snapshot, so a reader can act on a change instead of polling for it; it
    returns the function that unsubscribes.
    """

    def snapshot(self) -> FleetSnapshot: ...

    def subscribe(self, listener: Listener) -> Callable[[], None]: ...


class Subscribers:
    """The listeners of one source; thread-safe. A listener that raises is logged and the
    others still run: a reader's bug must not stop the source's refresh. Each subscription
    is its own (a token): the same callable subscribed twice is called twice, and each
    unsubscribe ends only its own subscription."""

    def __init__(self) -> None:
        self._listeners: dict[object, Listener] = {}
        self._lock = threading.Lock()

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        token = object()
        with self._lock:
            self._listeners[token] = listener

        def unsubscribe() -> None:
            with self._lock:
                self._listeners.pop(token, None)

        return unsubscribe

    def notify(self) -> None:
        with self._lock:
            listeners = list(self._listeners.values())
        for listener in listeners:
            try:
                listener()
            except Exception:
                log.exception("an inventory listener failed")

"""The kube source: the fleet read from NodeInventory objects through one informer.

Each informer event replaces (ADDED, MODIFIED) or removes (DELETED) one node in the
snapshot, so an event costs that node's entries, never the fleet's; ``snapshot()`` only
reads an attribute. The stamps are the publishers' ``publishedAt``, read as published.

Failure policy, as in mesh mode:

* a **control-plane outage** (the watch fails, lists fail) changes nothing: the informer
  backs off and retries, every node keeps its last inventory, and since no stamp moves
  the reference does not move either, so nobody is dropped; stall credit (``stall_after``
  = the publish interval) keeps the first publishes after a long outage from dropping
  the nodes that have not published again yet;
* an **object that cannot be read** (one a hand edit broke) is logged once, and its node
  keeps its last good inventory, which ages until the rule drops it;
* a **deleted object** removes its node at once.

``start()`` waits up to ``sync_timeout`` for the first list and fails loudly (one line,
asking whether the CRD is installed) when it does not come.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import operator
import threading
from datetime import timedelta
from typing import Any, cast

from kubernetes import client

from sandboxctl.clock import Clock, SystemClock
from sandboxctl.core.durations import format_duration
from sandboxctl.core.errors import InventoryFormatError, SandboxctlError
from sandboxctl.core.model import Entry, NodeInventory, inventory_from_object
from sandboxctl.core.snapshot import FleetSnapshot
from sandboxctl.kube import NODE_INVENTORIES, CustomObjects, Informer
from sandboxctl.kube.informer import ADDED, DELETED, MODIFIED

log = logging.getLogger(__name__)


_name_of = operator.methodcaller("get", "name")


SYNC_TIMEOUT = timedelta(minutes=2)


class KubeStartError(SandboxctlError):
    """The first list of NodeInventory objects did not come in time."""


class KubeInventorySource:
    """An :class:`InventorySource` fed by an informer on ``nodeinventories``."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        stall_after: timedelta | None = None,
        clock: Clock | None = None,
        sync_timeout: timedelta = SYNC_TIMEOUT,
        watch_seconds: int = 300,
        backoff_max: float = 30.0,
    ) -> None:
        self._clock = clock or SystemClock()
        self._snapshot = FleetSnapshot.empty(stall_after=stall_after)
        self._lock = threading.Lock()
        self._sync_timeout = sync_timeout
        self._unreadable: set[str] = set()
        # node -> its last entries' JSON and the entries read from it, for the next event
        self._entries: dict[str, tuple[list[Any], tuple[Entry, ...]]] = {}
        self.events = 0
        self.informer = Informer(
            CustomObjects(api, NODE_INVENTORIES),
            self.on_event,
            watch_seconds=watch_seconds,
            backoff_max=backoff_max,
            name="nodeinventories",
        )

    # --- the InventorySource protocol ---------------------------------------------------

    def snapshot(self) -> FleetSnapshot:
        return self._snapshot

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self.informer.start()
        if not self.informer.wait_synced(self._sync_timeout.total_seconds()):
            error = self.informer.last_error
            self.informer.stop()
            raise KubeStartError(
                f"no list of nodeinventories.sandbox.cocoonstack.io within "
                f"{format_duration(self._sync_timeout)}: is the CRD installed (kubectl apply "
                f"-f manifests/crds) and may this identity list it? "
                f"Last error: {error or 'none'}"
            )

    def stop(self) -> None:
        self.informer.stop()

    def __enter__(self) -> KubeInventorySource:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- events -------------------------------------------------------------------------

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        """One informer event: one node replaced or removed."""
        name = str((obj.get("metadata") or {}).get("name") or "")
        if kind == DELETED:
            self._entries.pop(name, None)
            with self._lock:
                self._snapshot = self._snapshot.remove(name, self._clock.monotonic())
                self.events += 1
            return
        if kind not in (ADDED, MODIFIED):
            return
        try:
            inventory = self._read(name, obj)
        except InventoryFormatError as error:
            if name not in self._unreadable:
                log.warning(
                    "NodeInventory %s cannot be read (%s); node %s keeps its last inventory",
                    name,
                    error,
                    name,
                )
                self._unreadable.add(name)
            return
        self._unreadable.discard(name)
        with self._lock:
            self._snapshot = self._snapshot.replace(inventory, self._clock.monotonic())
            self.events += 1

    def _read(self, name: str, obj: dict[str, Any]) -> NodeInventory:
        """The object as an inventory. A republish mostly repeats its entries, so an entry
        whose JSON equals one of the node's last ones is reused rather than read again
        (reading is the bulk of an event's cost: two timestamps to parse per entry)."""
        raws = obj.get("entries")
        previous = self._entries.get(name)
        if not isinstance(raws, list) or previous is None:
            inventory = inventory_from_object(obj)
        else:
            inventory = _reusing(obj, raws, *previous)
        if isinstance(raws, list):
            self._entries[name] = (raws, inventory.entries)
        else:
            self._entries.pop(name, None)
        return inventory


def _reusing(
    obj: dict[str, Any], raws: list[Any], last_raws: list[Any], last: tuple[Entry, ...]
) -> NodeInventory:
    """Read ``obj``, taking each entry whose JSON equals one in ``last_raws`` from ``last``.

    An entry is matched at its position first (compared in C, all at once), then by name.
    Equal JSON reads to an equal entry, so reuse is right whatever is matched with what,
    names held twice included."""
    count = len(raws)
    entries: list[Entry | None] = [*last[:count], *itertools.repeat(None, count - len(last))]
    same = map(operator.not_, map(operator.eq, raws, last_raws))
    misses = itertools.chain(itertools.compress(range(count), same), range(len(last), count))
    by_name: dict[Any, int] | None = None
    fresh: list[int] = []
    for i in misses:
        raw = raws[i]
        if by_name is None:
            by_name = dict(zip(map(_name_of, last_raws), range(len(last_raws)), strict=True))
        held = raw.get("name") if isinstance(raw, dict) else None
        at = by_name.get(held) if isinstance(held, str) else None
        if at is not None and last_raws[at] == raw:
            entries[i] = last[at]
        else:
            fresh.append(i)
    try:
        read = inventory_from_object({**obj, "entries": [raws[i] for i in fresh]})
    except InventoryFormatError:
        return inventory_from_object(obj)  # raises again, naming the entry by its own index
    for i, entry in zip(fresh, read.entries, strict=True):
        entries[i] = entry
    return dataclasses.replace(read, entries=cast(tuple[Entry, ...], tuple(entries)))  # all set

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
import logging
import threading
from datetime import timedelta
from typing import Any

from kubernetes import client

from sandboxctl.clock import Clock, SystemClock
from sandboxctl.core.durations import format_duration
from sandboxctl.core.errors import InventoryFormatError, SandboxctlError
from sandboxctl.core.model import Entry, NodeInventory, inventory_from_object
from sandboxctl.core.snapshot import FleetSnapshot
from sandboxctl.kube import NODE_INVENTORIES, CustomObjects, Informer
from sandboxctl.kube.informer import ADDED, DELETED, MODIFIED

log = logging.getLogger(__name__)


def _name_of(raw: Any) -> object:
    """An entry's key for reuse: its name and id (a name may be held twice on a node)."""
    if isinstance(raw, dict):
        return (raw.get("name"), raw.get("id"))
    return id(raw)


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
        # node -> entry key -> (its last JSON, its Entry), for reuse by the next event
        self._entries: dict[str, dict[object, tuple[Any, Entry]]] = {}
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
        whose JSON equals the node's last one is reused rather than read again (it is the
        bulk of an event's cost: two timestamps to parse per entry)."""
        raws = obj.get("entries")
        previous = self._entries.get(name)
        keys = list(map(_name_of, raws)) if isinstance(raws, list) else []
        if not isinstance(raws, list) or len(set(keys)) != len(keys):
            self._entries.pop(name, None)  # nothing to reuse from, or keys that repeat
            return inventory_from_object(obj)
        if previous is None:
            inventory = inventory_from_object(obj)
        else:
            fresh = [
                raw
                for raw, key in zip(raws, keys, strict=True)
                if previous.get(key, (None,))[0] != raw
            ]
            inventory = inventory_from_object({**obj, "entries": fresh})
            parsed = {
                _name_of(raw): entry for raw, entry in zip(fresh, inventory.entries, strict=True)
            }
            entries = tuple(parsed[key] if key in parsed else previous[key][1] for key in keys)
            inventory = dataclasses.replace(inventory, entries=entries)
        self._entries[name] = {
            key: (raw, entry) for key, raw, entry in zip(keys, raws, inventory.entries, strict=True)
        }
        return inventory

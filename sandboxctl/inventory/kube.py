"""The kube source: the fleet read from NodeInventory objects through one informer.

Each informer event replaces (ADDED, MODIFIED) or removes (DELETED) one node in the
snapshot, so an event costs that node's entries, never the fleet's, and of those only
what changed (see :meth:`KubeInventorySource._read`); ``snapshot()`` only reads an
attribute. The stamps are the publishers' ``publishedAt``, read as published.

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
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeGuard

import msgspec
from kubernetes import client

from sandboxctl.clock import Clock, SystemClock
from sandboxctl.core.durations import format_duration
from sandboxctl.core.errors import InventoryFormatError, SandboxctlError
from sandboxctl.core.model import Entry, NodeInventory, in_utc, inventory_from_object, read_metadata
from sandboxctl.core.snapshot import FleetSnapshot, collector_paused
from sandboxctl.inventory.source import Listener, Subscribers
from sandboxctl.kube import NODE_INVENTORIES, CustomObjects, Informer
from sandboxctl.kube.informer import ADDED, DELETED, MODIFIED, metadata_only
from sandboxctl.kube.resources import read_json, watch_event

log = logging.getLogger(__name__)


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
        self._subscribers = Subscribers()
        self._lock = threading.Lock()
        self._sync_timeout = sync_timeout
        self._unreadable: set[str] = set()
        # node -> its last entries' JSON and the entries read from it, for the next event
        self._raws: dict[str, tuple[list[msgspec.Raw], tuple[Entry, ...]]] = {}
        self.events = 0
        self.informer = Informer(
            CustomObjects(api, NODE_INVENTORIES, decode_event=inventory_event),
            self.on_event,
            watch_seconds=watch_seconds,
            backoff_max=backoff_max,
            name="nodeinventories",
            keep=metadata_only,  # the snapshot holds each node's inventory
        )

    # --- the InventorySource protocol ---------------------------------------------------

    def snapshot(self) -> FleetSnapshot:
        return self._snapshot

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        return self._subscribers.subscribe(listener)

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
            self._raws.pop(name, None)
            with self._lock:
                self._snapshot = self._snapshot.remove(name, self._clock.monotonic())
                self.events += 1
            self._subscribers.notify()
            return
        if kind not in (ADDED, MODIFIED):
            return
        try:
            with collector_paused():
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
        with self._lock, collector_paused():
            self._snapshot = self._snapshot.replace(inventory, self._clock.monotonic())
            self.events += 1
        self._subscribers.notify()

    def _read(self, name: str, obj: dict[str, Any]) -> NodeInventory:
        """The object as an inventory. A republish mostly repeats its entries: an entry
        whose JSON is the same bytes as the node's last one at its place is that entry,
        and only the others are decoded (then matched by name: an equal one is reused
        too), so the event and the snapshot's replace cost what changed."""
        raws = obj.get("entries")
        if not _raw(raws):  # a list's object, plain JSON
            self._raws.pop(name, None)
            return inventory_from_object(obj)
        record = self._snapshot.record(name)
        last = record.inventory.entries if record is not None else ()
        kept = self._raws.get(name)
        last_raws = kept[0] if kept is not None and kept[1] is last else []
        inventory = inventory_from_object({**obj, "entries": []})
        entries = _entries(obj, raws, last_raws, last)
        self._raws[name] = (raws, entries)
        return dataclasses.replace(inventory, entries=entries)


def _raw(entries: object) -> TypeGuard[list[msgspec.Raw]]:
    """Entries as :func:`inventory_event` leaves them (all are, or none)."""
    return isinstance(entries, list) and bool(entries) and isinstance(entries[0], msgspec.Raw)


def _entries(
    obj: dict[str, Any],
    raws: list[msgspec.Raw],
    last_raws: list[msgspec.Raw],
    last: tuple[Entry, ...],
) -> tuple[Entry, ...]:
    """The entries of ``raws``: ``last[i]`` where ``raws[i]`` is ``last_raws[i]``'s bytes
    (compared in C, all at once); the others decoded in one call."""
    count, common = len(raws), min(len(raws), len(last_raws))
    entries: list[Entry] = [*last[:common], *itertools.repeat(_NO_ENTRY, count - common)]
    misses = [
        *itertools.compress(range(common), map(operator.ne, raws, last_raws)),
        *range(common, count),
    ]
    if not misses:
        return tuple(entries)
    try:
        decoded = _decode_entries(b"[%b]" % b",".join([raws[i] for i in misses]))
        by_name = {e.name: e for e in reversed(last)}  # a name held twice: its first
        for i, entry in zip(misses, decoded, strict=True):
            same = by_name.get(entry.name)
            entries[i] = same if same is not None and same == entry else in_utc(entry)
    except (msgspec.DecodeError, OverflowError):
        # Read whole as plain JSON, as any other object is: a form the wire's rules
        # refuse but the reader tolerates (a null string, invalid UTF-8 replaced), or
        # the error naming the entry.
        plain = [read_json(bytes(raw)) for raw in raws]
        return inventory_from_object({**obj, "entries": plain}).entries
    return tuple(entries)


_NO_ENTRY = Entry("-", "-")  # a placeholder every miss overwrites
_decode_entries = msgspec.json.Decoder(list[Entry], dec_hook=read_metadata).decode


# --- the watch's events, entries left as their JSON ---------------------------------------


class _Inventory(msgspec.Struct, rename="camel"):
    """What the source reads of a NodeInventory object, each entry left as its JSON."""

    api_version: Any = msgspec.UNSET
    kind: Any = msgspec.UNSET
    metadata: Any = msgspec.UNSET
    node: Any = msgspec.UNSET
    address: Any = msgspec.UNSET
    pools: Any = msgspec.UNSET
    templates: Any = msgspec.UNSET
    entries: list[msgspec.Raw] | msgspec.UnsetType | None = msgspec.UNSET
    published_at: Any = msgspec.UNSET
    capacity: Any = msgspec.UNSET


class _Event(msgspec.Struct):
    type: str
    object: _Inventory


_FIELDS = [(f.name, f.encode_name) for f in msgspec.structs.fields(_Inventory)]
_decode_event = msgspec.json.Decoder(_Event).decode


def inventory_event(line: bytes) -> dict[str, Any]:
    """One watch event on ``nodeinventories``, each entry left as its JSON (a
    ``msgspec.Raw``: a slice of the line's bytes, for :meth:`KubeInventorySource._read`
    to compare with the last). An event of another shape (an ERROR's status, entries
    that are not a list) is read as :func:`watch_event` reads it. The informer caches
    only each object's metadata."""
    try:
        event = _decode_event(line)
    except msgspec.DecodeError:
        return watch_event(line)
    if event.type == "ERROR":
        return watch_event(line)
    obj = event.object
    fields = {
        key: value for name, key in _FIELDS if (value := getattr(obj, name)) is not msgspec.UNSET
    }
    return {"type": event.type, "object": fields}

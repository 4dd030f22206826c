"""``--busy-source sandbox-hosts``: the sandbox fleet protects its own hosts.

A worker pod is busy while the NodeInventory of its node lists claimed sandboxes (any
entry: a running or hibernated claim lives on that host). Read through one informer on
``nodeinventories``; a node with no NodeInventory, or a pod not yet on a node, is idle.
An inventory that cannot be read keeps its node's last reading (and is logged once).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from kubernetes import client

from sandboxctl.core.errors import InventoryFormatError
from sandboxctl.core.model import inventory_from_object
from sandboxctl.guard.busy import Changed, ignore_change
from sandboxctl.guard.decide import Busy
from sandboxctl.guard.pods import PodView
from sandboxctl.kube import NODE_INVENTORIES, CustomObjects, Informer
from sandboxctl.kube.informer import DELETED

log = logging.getLogger(__name__)


class SandboxHostsSource:
    name = "sandbox-hosts"

    def __init__(self, api: client.ApiClient, watch_seconds: int = 300) -> None:
        self._claims: dict[str, int] = {}  # node -> claimed sandboxes
        self._lock = threading.Lock()
        self._changed: Changed = ignore_change
        self._unreadable: set[str] = set()
        self.informer = Informer(
            CustomObjects(api, NODE_INVENTORIES),
            self.on_event,
            watch_seconds=watch_seconds,
            name="guard-nodeinventories",
        )

    def start(self, changed: Changed) -> None:
        self._changed = changed
        self.informer.start()

    def stop(self) -> None:
        self.informer.stop()

    def wait_synced(self, timeout: float) -> bool:
        # Synced means the handler has seen the first list too, not only the cache.
        if not self.informer.wait_synced(timeout):
            return False
        for obj in self.informer.items():
            self.on_event("SYNC", obj)
        return True

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        if kind == DELETED:
            claims = 0
        else:
            try:
                claims = len(inventory_from_object(obj).entries)
            except InventoryFormatError as error:
                if name not in self._unreadable:
                    log.warning("event=inventory-unreadable node=%s error=%r", name, str(error))
                    self._unreadable.add(name)
                return
            self._unreadable.discard(name)
        with self._lock:
            before = self._claims.get(name, 0)
            if claims:
                self._claims[name] = claims
            else:
                self._claims.pop(name, None)
        if (before > 0) != (claims > 0):
            self._changed()

    def reading(self, pod: PodView) -> Busy:
        return Busy.BUSY if self._claims.get(pod.node, 0) > 0 else Busy.IDLE

    def detail(self, pod: PodView) -> str:
        if not pod.node:
            return "not on a node yet"
        return f"{self._claims.get(pod.node, 0)} claimed sandboxes on {pod.node}"

"""Which node owns a sandbox: the one memory of it, shared by every API of a process.

A lookup that had to ask the nodes (a claim another replica made since the last publish),
or that found a sandbox the e2b API or the envd proxy will ask for again, is remembered
here under the sandbox's id (either spelling: ``SandboxId`` compares by the public one)
and, for the Sandbox API, under its (namespace, name). One policy for every entry:

* bounded: at most ``capacity`` entries, the least recently used going first;
* forgotten when this server releases the sandbox, or its node says it is gone (a kill,
  a refused claim token);
* forgotten when an inventory change drops it: its node goes stale or leaves, or its
  node's inventory, which listed it, no longer does;
* an owner no inventory has listed yet (a claim made since the last publish, by this
  server or another replica) is forgotten ``unlisted_for`` seconds after it was
  remembered unless its node's inventory lists it by then: a node publishes well within
  that (the store passes its write bound, the freshness rule's stale-after), so a claim
  still unlisted is one its node no longer holds (released through another replica
  before a publish), and nothing else would ever drop it.

"Listed" is the node's own inventory record, never this server's pending writes laid
over it. A sandbox that moved is found where the inventories put it, since they are read
first and a remembered owner is served only while no other node lists it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sandboxctl.agentapi import SandboxRow
from sandboxctl.core.ids import SandboxId
from sandboxctl.core.snapshot import NodeRecord

CAPACITY = 8192

Key = SandboxId | tuple[str, str]  # an id, or a (namespace, name)


@dataclass(frozen=True, slots=True)
class Owner:
    """The node holding a sandbox, at its advertised address, under ``claim_id``. Once
    its node was asked for its live row: the claim token (never sent but to that node),
    whether guest ports are public, and its address on the node's network."""

    node: str
    address: str
    claim_id: str
    token: str = ""
    public_traffic: bool = True
    sandbox_address: str = ""
    # Whether its node's own inventory (not a pending write of this server) has listed
    # it: when remembered, or at an inventory change since.
    listed: bool = False

    def with_row(self, row: SandboxRow) -> Owner:
        public = not row.network or row.network.public_traffic
        token, address = row.token or "", row.address or ""
        return dataclasses.replace(
            self, claim_id=row.id, token=token, public_traffic=public, sandbox_address=address
        )


class Owners:
    """Thread-safe."""

    def __init__(
        self,
        capacity: int = CAPACITY,
        *,
        clock: Callable[[], float] = time.monotonic,
        unlisted_for: float | None = None,
    ) -> None:
        self._capacity = capacity
        self._clock = clock
        self._unlisted_for = unlisted_for  # None: an unlisted owner never expires
        self._entries: OrderedDict[Key, Owner] = OrderedDict()
        self._unlisted_until: dict[Key, float] = {}
        self._by_node: dict[str, set[Key]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Key) -> Owner | None:
        with self._lock:
            owner = self._entries.get(key)
            if owner is None:
                return None
            until = self._unlisted_until.get(key)
            if until is not None and self._clock() >= until:
                self._drop(key)
                return None
            self._entries.move_to_end(key)
            return owner

    def remember(self, owner: Owner, *keys: Key) -> None:
        with self._lock:
            until = None
            if not owner.listed and self._unlisted_for is not None:
                until = self._clock() + self._unlisted_for
            for key in keys:
                self._drop(key)
                self._entries[key] = owner
                self._by_node.setdefault(owner.node, set()).add(key)
                if until is not None:
                    self._unlisted_until[key] = until
            while len(self._entries) > self._capacity:
                self._drop(next(iter(self._entries)))

    def forget(self, *keys: Key) -> None:
        with self._lock:
            for key in keys:
                self._drop(key)

    def nodes_changed(self, changed: Iterable[tuple[str, NodeRecord | None]]) -> None:
        """Apply the inventory changes ``changed`` names: each node whose record this
        server reads is a new one, with that record (None: the node went stale or left)."""
        with self._lock:
            for node, record in changed:
                for key in list(self._by_node.get(node, ())):
                    owner = self._entries[key]
                    if record is None:
                        self._drop(key)
                    elif owner.claim_id in record.by_id:
                        if not owner.listed:
                            self._entries[key] = dataclasses.replace(owner, listed=True)
                            self._unlisted_until.pop(key, None)
                    elif owner.listed:
                        self._drop(key)

    def _drop(self, key: Key) -> None:
        owner = self._entries.pop(key, None)
        self._unlisted_until.pop(key, None)
        if owner is None:
            return
        keys = self._by_node.get(owner.node)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_node[owner.node]

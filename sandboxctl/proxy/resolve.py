"""Sandbox id -> the owning node's address and the sandbox's claim token.

Resolution order (each step only when the one before missed):

1. the recent-owner cache (``owner_ttl``, at most 4096 entries), kept only while the
   node is still fresh and advertises the same address;
2. the inventories (the store's ``locate_claim`` over inventories only, either id
   spelling), then the owning node's live row for the claim token;
3. for an id no inventory lists yet (a claim made since the last publish), a probe of
   every fresh node under the per-replica token bucket; over budget the id is unknown.

Every node asked comes from the store's fresh view, so a stale node is never contacted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sandboxctl.agentapi import SandboxRow
from sandboxctl.apiserver.e2b.ids import claim_spelling, public_id, same_sandbox
from sandboxctl.core.errors import SandboxctlError
from sandboxctl.proxy.budget import TokenBucket
from sandboxctl.store import SandboxStore

CACHE_CAPACITY = 4096


@dataclass(frozen=True, slots=True)
class Owner:
    node: str
    address: str
    claim_id: str
    token: str  # the claim token: never leaves the proxy except to the owning node
    public_traffic: bool = True  # False: guest ports need the traffic access token
    sandbox_address: str = ""  # on its veth, when the agent gives it a network


class OwnerCache:
    """Recent owners by public id. On overflow expired entries go; if it is still full,
    everything goes (one cheap step instead of an LRU on every hit)."""

    def __init__(
        self,
        ttl: float,
        capacity: int = CACHE_CAPACITY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self.capacity = capacity
        self._clock = clock
        self._entries: dict[str, tuple[float, Owner]] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> Owner | None:
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            if found[0] <= self._clock():
                del self._entries[key]
                return None
            return found[1]

    def put(self, key: str, owner: Owner) -> None:
        with self._lock:
            now = self._clock()
            if key not in self._entries and len(self._entries) >= self.capacity:
                self._entries = {k: v for k, v in self._entries.items() if v[0] > now}
                if len(self._entries) >= self.capacity:
                    self._entries.clear()
            self._entries[key] = (now + self.ttl, owner)

    def forget(self, key: str) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)


class Resolver:
    def __init__(
        self,
        store: SandboxStore,
        budget: TokenBucket,
        cache: OwnerCache,
        on_probe: Callable[[], None] = lambda: None,
    ) -> None:
        if not store.routes_claims:
            raise ValueError("the envd proxy needs a store with node access (NodeAccess)")
        self.store = store
        self.budget = budget
        self.cache = cache
        self.on_probe = on_probe

    def cached(self, requested: str) -> Owner | None:
        """The cached owner while its node is still fresh at the same address; no I/O, so
        the hot path can call it without leaving the event loop."""
        key = public_id(requested)
        cached = self.cache.get(key)
        if cached is None:
            return None
        if self.store.address(cached.node) == cached.address:
            return cached
        self.cache.forget(key)
        return None

    def resolve(self, requested: str) -> Owner | None:
        """The owner of ``requested`` (either id spelling), or None when no fresh node
        holds it, a node could not say, or the probe budget is spent."""
        cached = self.cached(requested)
        if cached is not None:
            return cached
        key = public_id(requested)
        owner = self._from_inventory(requested)
        if owner is None:
            owner = self._probe(requested)
        if owner is not None:
            self.cache.put(key, owner)
        return owner

    def forget(self, requested: str) -> None:
        self.cache.forget(public_id(requested))

    def _from_inventory(self, requested: str) -> Owner | None:
        located = self.store.locate_claim(
            claim_spelling(requested),
            match=lambda claim_id: same_sandbox(requested, claim_id),
            ask_nodes=False,
        )
        if located is None:
            return None
        address = self.store.address(located.node)
        if address is None:
            return None
        try:
            row = self.store.read(located)  # the owning node's live row: the claim token
        except SandboxctlError:
            return None
        return _owner(located.node, address, row)

    def _probe(self, requested: str) -> Owner | None:
        if not self.budget.take():
            return None
        self.on_probe()
        spellings = list(dict.fromkeys((requested, claim_spelling(requested))))
        try:
            hit = self.store.probe(spellings)
        except SandboxctlError:
            return None
        if hit is None:
            return None
        located, row = hit
        address = self.store.address(located.node)
        return _owner(located.node, address, row) if address is not None else None


def _owner(node: str, address: str, row: SandboxRow) -> Owner | None:
    if not row.token:
        return None
    public = not row.network or row.network.public_traffic
    return Owner(node, address, row.id, row.token, public, row.address or "")

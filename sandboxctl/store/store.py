"""The sandbox store: one per process, its fleet reads and the claim routing over them.

``FleetReads`` (``reads``) is what this server reads of the fleet: the snapshot, its own
writes, the ledger's objects, lists, pages, watches and the template catalog.
``OwnerResolver`` (``resolver``) answers which node holds a sandbox, asking the agents
when the reads do not say. ``ClaimRouter`` (``claims``) places claims and sends the verbs
on a claimed sandbox to its node. The store serves the parts' methods as its own, so a
service holds one object; ``get`` is the one read that needs two parts.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

from sandboxctl.clock import Clock
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.inventory.source import InventorySource
from sandboxctl.store.claims import ClaimRouter
from sandboxctl.store.errors import NotFound
from sandboxctl.store.ledger import DEFAULT_RETAIN
from sandboxctl.store.nodes import NodeAccess
from sandboxctl.store.reads import FleetReads, ReadStats
from sandboxctl.store.resolver import OwnerResolver

P = ParamSpec("P")
R = TypeVar("R")


class _Of(Generic[P, R]):
    """A method of one of the store's parts, served as the store's own."""

    def __init__(self, part: str, method: Callable[Concatenate[Any, P], R]) -> None:
        self._part = part
        self._name = method.__name__

    def __get__(self, store: object, owner: type | None = None) -> Callable[P, R]:
        method: Callable[P, R] = getattr(getattr(store, self._part), self._name)
        return method


class SandboxStore:
    """Every service of a process reads and claims through it."""

    def __init__(
        self,
        source: InventorySource,
        rule: FreshnessRule,
        *,
        clock: Clock | None = None,
        nodes: NodeAccess | None = None,
        rng: random.Random | None = None,
        retain: int = DEFAULT_RETAIN,
        write_bound: timedelta | None = None,
        first_version: int | None = None,
    ) -> None:
        self.reads = FleetReads(
            source,
            rule,
            clock=clock,
            retain=retain,
            write_bound=write_bound,
            first_version=first_version,
        )
        self.resolver = OwnerResolver(self.reads, nodes)  # no nodes: inventories only
        self.claims = ClaimRouter(self.reads, self.resolver, rng)

    def close(self) -> None:
        """Close the connections to nodes, and stop following the source (which belongs
        to the caller)."""
        self.resolver.close()
        self.reads.close()

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        """The served object of a sandbox by name; NotFound when no fresh node holds it."""
        located = self.resolver.locate(namespace, name)
        if located is None:
            raise NotFound(f'sandboxes "{name}"')
        return self.reads.object_of(located)

    @property
    def stats(self) -> ReadStats:
        return self.reads.stats

    @property
    def routes_claims(self) -> bool:
        return self.resolver.routes_claims

    # --- fleet reads ---------------------------------------------------------------------
    now = _Of("reads", FleetReads.now)
    sync = _Of("reads", FleetReads.sync)
    state = _Of("reads", FleetReads.state)
    changes_since = _Of("reads", FleetReads.changes_since)
    check_version = _Of("reads", FleetReads.check_version)
    subscribe = _Of("reads", FleetReads.subscribe)
    retained_changes = _Of("reads", FleetReads.retained_changes)
    fresh_nodes = _Of("reads", FleetReads.fresh_nodes)
    address = _Of("reads", FleetReads.address)
    has_template = _Of("reads", FleetReads.has_template)
    templates = _Of("reads", FleetReads.templates)
    template_entries = _Of("reads", FleetReads.template_entries)
    warm_candidates = _Of("reads", FleetReads.warm_candidates)
    list = _Of("reads", FleetReads.list)
    watch = _Of("reads", FleetReads.watch)
    page = _Of("reads", FleetReads.page)
    object_of = _Of("reads", FleetReads.object_of)

    # --- claim routing -------------------------------------------------------------------
    claim = _Of("claims", ClaimRouter.claim)
    release = _Of("claims", ClaimRouter.release)
    renew = _Of("claims", ClaimRouter.renew)
    set_network = _Of("claims", ClaimRouter.set_network)
    pause = _Of("claims", ClaimRouter.pause)
    resume = _Of("claims", ClaimRouter.resume)
    usage = _Of("claims", ClaimRouter.usage)

    # --- the owner resolver --------------------------------------------------------------
    locate = _Of("resolver", OwnerResolver.locate)
    locate_claim = _Of("resolver", OwnerResolver.locate_claim)
    owner = _Of("resolver", OwnerResolver.owner)
    cached_owner = _Of("resolver", OwnerResolver.cached_owner)
    row_of = _Of("resolver", OwnerResolver.row_of)
    forget = _Of("resolver", OwnerResolver.forget)
    log_of = _Of("resolver", OwnerResolver.log_of)

"""The sandbox store: the fleet's inventories served as Sandbox objects.

Reads come from the source's snapshot under the freshness rule, so a stale node is
invisible to every read, verb and claim, and receives no request. Lookups by name or
claim id resolve in this order (each step only when the one before missed):

1. the owning-node index, then that node's inventory;
2. that node's agent, live (a claim made since its last publish);
3. every fresh node's inventory;
4. with claim routing, every fresh node's agent, live.

A hit is remembered in the index, so a read right after a create asks only the node that
holds the new sandbox.
"""

from __future__ import annotations

import builtins
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from sandboxctl.clock import Clock, SystemClock
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.model import PoolKey
from sandboxctl.core.placement import Delivered, Failed, Outcome, Undelivered, place
from sandboxctl.core.sandboxes import sandbox_fields, sandbox_labels, sandbox_object
from sandboxctl.core.selectors import SANDBOX_FIELDS, FieldSelector, LabelSelector
from sandboxctl.core.snapshot import FleetView, Located, WarmCandidate
from sandboxctl.inventory.mapping import entry_from_row
from sandboxctl.inventory.source import InventorySource
from sandboxctl.sandboxd.client import SandboxdClient, SandboxdError
from sandboxctl.store.errors import ClaimRoutingOff, NodeRefused, NodeUnavailable, NotFound
from sandboxctl.store.index import OwnerIndex
from sandboxctl.store.nodes import NodeAccess, undelivered


@dataclass(frozen=True, slots=True)
class Query:
    """Which sandboxes a list or watch wants. ``namespace`` None means all namespaces."""

    namespace: str | None = None
    labels: LabelSelector = field(default_factory=lambda: LabelSelector.parse(""))
    fields: FieldSelector = field(
        default_factory=lambda: FieldSelector.parse("", allowed=SANDBOX_FIELDS)
    )

    @classmethod
    def parse(cls, namespace: str | None, labels: str = "", fields: str = "") -> Query:
        """Parse selectors; InvalidValueError (400) names what is wrong."""
        return cls(
            namespace or None,
            LabelSelector.parse(labels),
            FieldSelector.parse(fields, allowed=SANDBOX_FIELDS, resource="sandboxes"),
        )

    @property
    def pin(self) -> tuple[str, str] | None:
        """(namespace, name) that a namespaced query with ``metadata.name=<x>`` follows."""
        if self.namespace is None:
            return None
        name = self.fields.exact("metadata.name")
        return (self.namespace, name) if name else None

    def accepts(self, located: Located) -> bool:
        namespace, _ = located.entry.namespaced_name
        if self.namespace is not None and namespace != self.namespace:
            return False
        return self.labels.matches(sandbox_labels(located)) and self.fields.matches(
            sandbox_fields(located)
        )


@dataclass(frozen=True, slots=True)
class Assignment:
    """A granted claim. The token stays inside the server; callers derive from it."""

    claim_id: str
    node: str
    address: str
    token: str
    deadline: str | None


@dataclass(slots=True)
class ReadStats:
    """What reads cost, for tests and benchmarks: fleet sweeps, single-node reads, and
    live requests per node address."""

    fleet_reads: int = 0
    node_reads: int = 0
    live_asks: dict[str, int] = field(default_factory=dict)

    def asked(self, address: str) -> None:
        self.live_asks[address] = self.live_asks.get(address, 0) + 1


class SandboxStore:
    def __init__(
        self,
        source: InventorySource,
        rule: FreshnessRule,
        *,
        clock: Clock | None = None,
        nodes: NodeAccess | None = None,
        rng: random.Random | None = None,
        index: OwnerIndex | None = None,
        indexed: bool = True,
    ) -> None:
        self.source = source
        self.rule = rule
        self.clock = clock or SystemClock()
        self.nodes = nodes  # None: no claim routing, lookups read inventories only
        self.index = index if index is not None else OwnerIndex()
        self.stats = ReadStats()
        self.indexed = indexed  # False only to measure what the indexes buy
        self._rng = rng or random.Random()

    def close(self) -> None:
        """Close the connections to nodes (the source belongs to the caller)."""
        if self.nodes is not None:
            self.nodes.close()

    # --- reads ---------------------------------------------------------------------------

    def view(self) -> FleetView:
        return self.source.snapshot().view(self.rule, self.clock.now(), self.clock.monotonic())

    def list(self, query: Query) -> list[dict[str, Any]]:
        """Sandbox objects matching the query, sorted by (namespace, name)."""
        if query.pin is not None:
            found = self.list_pinned(query)
            return [sandbox_object(found)] if found else []
        return [sandbox_object(located) for located in self.sweep(self.view(), query)]

    def sweep(self, view: FleetView, query: Query) -> builtins.list[Located]:
        """Every fresh entry the query accepts, sorted by (namespace, name)."""
        self.stats.fleet_reads += 1
        found = [loc for loc in view.entries(query.namespace) if query.accepts(loc)]
        found.sort(key=lambda loc: (loc.entry.namespaced_name, loc.node))
        return found

    def list_pinned(self, query: Query) -> Located | None:
        """The one sandbox a pinned list names. When resolution finds a duplicate the
        selectors reject, the inventories are swept for one they accept, so a pinned list
        and a pinned watch agree on which duplicate they follow."""
        if query.pin is None:
            raise ValueError("list_pinned needs a pinned query")
        located = self.locate(*query.pin)
        if located is None or query.accepts(located):
            return located
        return self.first_accepted(self.view(), query)

    def first_accepted(self, view: FleetView, query: Query) -> Located | None:
        """Sweep the inventories for the pinned name; ask no agent."""
        if query.pin is None:
            raise ValueError("first_accepted needs a pinned query")
        self.stats.fleet_reads += 1
        for located in view.lookup_name(*query.pin):
            if query.accepts(located):
                return located
        return None

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        located = self.locate(namespace, name)
        if located is None:
            raise NotFound(f'sandboxes "{name}"')
        return sandbox_object(located)

    def locate(self, namespace: str, name: str) -> Located | None:
        view = self.view()
        if not self.indexed:
            self.stats.fleet_reads += 1
            return next(
                (loc for loc in view.entries(namespace) if loc.entry.namespaced_name[1] == name),
                None,
            )
        node = self.index.name(namespace, name)
        if node is not None:
            found = self._on_node_by_name(view, node, namespace, name)
            if found is not None:
                return found
        for located in view.lookup_name(namespace, name):
            self.index.remember_name(namespace, name, located.node)
            return located
        if self.nodes is not None:
            found = self._fan_out(view, lambda c, n: self._live_by_name(c, n, namespace, name))
            if found is not None:
                self.index.remember_name(namespace, name, found.node)
                return found
        return None

    def locate_claim(
        self,
        claim_id: str,
        namespace: str | None = None,
        match: Callable[[str], bool] | None = None,
    ) -> Located | None:
        """A sandbox by claim id. ``match`` widens equality (e.g. the e2b id spelling)."""
        view = self.view()
        accepts = match or (lambda candidate: candidate == claim_id)

        def wanted(located: Located) -> bool:
            ns, _ = located.entry.namespaced_name
            return (
                bool(located.entry.id)
                and accepts(located.entry.id)
                and (namespace is None or ns == namespace)
            )

        node = self.index.claim(namespace or "", claim_id)
        if node is not None:
            self.stats.node_reads += 1
            record = view.inventory(node)
            if record is not None:
                for entry in record.entries:
                    if wanted(Located(node, entry)):
                        return Located(node, entry)
            found = self._live_on(view, node, lambda c: self._live_by_id(c, node, claim_id))
            if found is not None and wanted(found):
                return found
        located = view.lookup_claim_id(claim_id)
        if located is not None and wanted(located):
            self.index.remember_claim(namespace or "", claim_id, located.node)
            return located
        if match is not None:  # another spelling: the index by id cannot answer, sweep
            self.stats.fleet_reads += 1
            for located in view.entries(namespace):
                if wanted(located):
                    return located
        if self.nodes is not None:
            found = self._fan_out(view, lambda c, n: self._live_by_id(c, n, claim_id))
            if found is not None and wanted(found):
                self.index.remember_claim(namespace or "", claim_id, found.node)
                return found
        return None

    def held_by_node(self, located: Located, query: Query) -> bool:
        """Whether the sandbox's node still lists it live and the query still accepts it
        (a pinned watch keeps such an entry while the next publish catches up)."""
        view = self.view()
        namespace, name = located.entry.namespaced_name
        found = self._on_node_live_by_name(view, located.node, namespace, name)
        return found is not None and query.accepts(found)

    # --- claims and verbs ------------------------------------------------------------

    def claim(
        self,
        namespace: str,
        name: str,
        key: PoolKey,
        ttl_seconds: int = 0,
        metadata: Mapping[str, str] | None = None,
        on_expire: str = "destroy",
        env: Mapping[str, str] | None = None,
    ) -> Assignment:
        """Place a claim by power of two choices over fresh warm capacity.

        ``env`` is the sandbox's environment for the commands envd starts in it; the
        owning agent validates and stores it, and never lists it.

        Raises NoWarmCapacity when no fresh node has warm capacity left, the node's
        refusal (NodeRefused) for a 4xx it gives, and NodeUnavailable when a request timed
        out after it went out (it may have been granted, so it is never retried)."""
        nodes = self._routing()
        view = self.view()
        candidates = view.warm_candidates(key)
        body = {
            "net": key.net,
            "size": key.size,
            "ttl_seconds": ttl_seconds,
            "claim_ref": f"{namespace}/{name}",
            "metadata": dict(metadata or {}),
            "on_expire": on_expire,
        }
        if env:  # only when given: an agent from before claim env refuses the field
            body["env"] = dict(env)

        def attempt(candidate: WarmCandidate) -> Outcome[Assignment]:
            try:
                granted = nodes.client(candidate.address).claim(key.template, **body)
            except (SandboxdError, httpx.HTTPError) as error:
                if undelivered(error):
                    return Undelivered(str(error))
                if isinstance(error, SandboxdError) and error.status == 404:
                    # On a claim the node's 404 is about the template, not a sandbox.
                    return Failed(NodeRefused(404, error.message))
                return Failed(_translate(error))
            return Delivered(
                Assignment(
                    claim_id=granted["id"],
                    node=candidate.node,
                    address=candidate.address,
                    token=granted["token"],
                    deadline=granted.get("deadline"),
                )
            )

        _, assignment = place(candidates, attempt, self._rng.randrange)
        self.index.remember_name(namespace, name, assignment.node)
        self.index.remember_claim(namespace, assignment.claim_id, assignment.node)
        self.index.remember_claim("", assignment.claim_id, assignment.node)
        return assignment

    def release(self, located: Located) -> None:
        """Release on the owning node; an already released sandbox counts as released."""
        client = self._owner(located)
        try:
            client.release(located.entry.id)
        except SandboxdError as error:
            if error.status != 404:
                raise _translate(error) from error
        except httpx.HTTPError as error:
            raise _translate(error) from error
        namespace, name = located.entry.namespaced_name
        self.index.forget(namespace, name, located.entry.id)

    def renew(self, located: Located, ttl_seconds: int) -> str | None:
        reply = self._verb(located, lambda c: c.renew(located.entry.id, ttl_seconds))
        return reply.get("deadline") if isinstance(reply, dict) else None

    def pause(self, located: Located) -> None:
        self._verb(located, lambda c: c.hibernate(located.entry.id))

    def resume(self, located: Located) -> None:
        self._verb(located, lambda c: c.wake(located.entry.id))

    def read(self, located: Located) -> dict[str, Any]:
        """The owning node's live row for a sandbox, with its claim token."""
        reply = self._verb(located, lambda c: c.get(located.entry.id))
        assert isinstance(reply, dict)
        return reply

    # --- internals -------------------------------------------------------------------

    def _routing(self) -> NodeAccess:
        if self.nodes is None:
            raise ClaimRoutingOff("claims need the fleet's root token (--sandboxd-token-file)")
        return self.nodes

    def _owner(self, located: Located) -> SandboxdClient:
        nodes = self._routing()
        inventory = self.view().inventory(located.node)
        if inventory is None or not inventory.address:
            raise NotFound(f'sandbox "{located.entry.name}"')  # its node went stale
        return nodes.client(inventory.address)

    def _verb(self, located: Located, call: Callable[[SandboxdClient], Any]) -> Any:
        client = self._owner(located)
        try:
            return call(client)
        except (SandboxdError, httpx.HTTPError) as error:
            raise _translate(error) from error

    def _on_node_by_name(
        self, view: FleetView, node: str, namespace: str, name: str
    ) -> Located | None:
        self.stats.node_reads += 1
        record = view.snapshot.record(node)
        if record is not None and view.is_fresh(node):
            entry = record.by_name.get((namespace, name))
            if entry is not None:
                return Located(node, entry)
        return self._on_node_live_by_name(view, node, namespace, name)

    def _on_node_live_by_name(
        self, view: FleetView, node: str, namespace: str, name: str
    ) -> Located | None:
        return self._live_on(view, node, lambda c: self._live_by_name(c, node, namespace, name))

    def _live_on(
        self, view: FleetView, node: str, ask: Callable[[SandboxdClient], Located | None]
    ) -> Located | None:
        if self.nodes is None:
            return None
        inventory = view.inventory(node)  # None when stale: a stale node is never asked
        if inventory is None or not inventory.address:
            return None
        self.stats.asked(inventory.address)
        return self.nodes.first_hit([inventory.address], ask)

    def _fan_out(
        self, view: FleetView, ask: Callable[[SandboxdClient, str], Located | None]
    ) -> Located | None:
        assert self.nodes is not None
        targets = []
        for node in view.fresh_nodes():
            inventory = view.inventory(node)
            if inventory is not None and inventory.address:
                targets.append((node, inventory.address))
        for _, address in targets:
            self.stats.asked(address)
        by_address = dict((address, node) for node, address in targets)
        return self.nodes.first_hit(
            [address for _, address in targets],
            lambda client: ask(client, by_address[client.address]),
        )

    @staticmethod
    def _live_by_name(
        client: SandboxdClient, node: str, namespace: str, name: str
    ) -> Located | None:
        for row in client.sandboxes(claim_ref=f"{namespace}/{name}"):
            entry = entry_from_row(row)
            if entry.namespaced_name == (namespace, name):  # a node may ignore the filter
                return Located(node, entry)
        return None

    @staticmethod
    def _live_by_id(client: SandboxdClient, node: str, claim_id: str) -> Located | None:
        try:
            row = client.get(claim_id)
        except SandboxdError as error:
            if error.status == 404:
                return None
            raise
        return Located(node, entry_from_row(row))


def _translate(error: Exception) -> Exception:
    if isinstance(error, SandboxdError):
        if error.status == 404:
            return NotFound(f"sandbox ({error.message})")
        if 400 <= error.status < 500:
            return NodeRefused(error.status, error.message)
        return NodeUnavailable(str(error))
    return NodeUnavailable(f"node did not answer: {error}")

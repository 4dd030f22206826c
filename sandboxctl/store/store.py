"""The sandbox store: the one read path to the fleet, for every API that serves it.

Reads come from the source's snapshot under the freshness rule, so a stale node is
invisible to every read, verb and claim, and receives no request. Over that snapshot the
store lays this server's own writes the inventories do not show yet (``overlay``), and
keeps every sandbox as one Kubernetes object with a resourceVersion and a log of changes
(``ledger``): lists, pages and watches read those, so a write through this server is
visible to its next read of any kind.

Lookups by name or claim id resolve in this order (each step only when the one before
missed):

1. what this server reads: the inventories with its pending writes applied;
2. the owning-node index (the node that answered for the name or id last time), live;
3. with claim routing, every fresh node's agent, live (a claim another replica made since
   the last publish).

A hit is remembered in the index, so a read right after a create asks only the node that
holds the new sandbox.
"""

from __future__ import annotations

import builtins
import dataclasses
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import msgspec
from msgspec import UNSET

from sandboxctl.agentapi import (
    AgentApiError,
    AgentClient,
    AgentError,
    ClaimGrant,
    ClaimRequest,
    SandboxLog,
    SandboxRow,
    UsageSample,
)
from sandboxctl.agentapi.mapping import HIBERNATED, RUNNING, entry_from_row
from sandboxctl.agentapi.models import ClaimedPolicy
from sandboxctl.agentapi.network import NetworkUpdate
from sandboxctl.clock import Clock, SystemClock
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.model import Entry, Metadata, PoolKey
from sandboxctl.core.netpolicy import NetworkPolicy
from sandboxctl.core.placement import (
    ColdCandidate,
    Delivered,
    Failed,
    NoWarmCapacity,
    Outcome,
    Undelivered,
    cold_candidates,
    place,
    place_cold,
    serves,
)
from sandboxctl.core.sandboxes import sandbox_fields, sandbox_labels, sandbox_object
from sandboxctl.core.selectors import SANDBOX_FIELDS, FieldSelector, LabelSelector
from sandboxctl.core.snapshot import FleetView, Located, NodeRecord, WarmCandidate
from sandboxctl.core.templates import READY_TIMEOUT
from sandboxctl.inventory.source import InventorySource
from sandboxctl.store.errors import ClaimRoutingOff, NodeRefused, NodeUnavailable, NotFound
from sandboxctl.store.index import OwnerIndex
from sandboxctl.store.ledger import DEFAULT_RETAIN, Change, Ledger, State
from sandboxctl.store.lists import ListPage, ListStates
from sandboxctl.store.nodes import NodeAccess, undelivered
from sandboxctl.store.overlay import PendingWrites
from sandboxctl.store.pages import KeyOf, SortedIndex
from sandboxctl.store.watch import Watch

CLAIM_SLACK = 10.0  # beyond a template's ready wait: the start itself and the answer


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

    @property
    def selects_all_in_namespace(self) -> bool:
        return self.labels.empty and self.fields.empty

    def accepts(self, located: Located) -> bool:
        namespace, _ = located.entry.namespaced_name
        if self.namespace is not None and namespace != self.namespace:
            return False
        if self.selects_all_in_namespace:
            return True
        return self.labels.matches(sandbox_labels(located)) and self.fields.matches(
            sandbox_fields(located)
        )


@dataclass(frozen=True, slots=True)
class Assignment:
    """A granted claim. The token stays inside the server; callers derive from it.
    ``located`` is the new sandbox as this server reads it from now on."""

    claim_id: str
    node: str
    address: str
    token: str
    deadline: datetime | None
    located: Located


@dataclass(slots=True)
class ReadStats:
    """What reads cost, for tests and benchmarks: live requests per node address, and
    node records the ledger read (rescans)."""

    live_asks: dict[str, int] = field(default_factory=dict)
    rescans: int = 0

    def asked(self, address: str) -> None:
        self.live_asks[address] = self.live_asks.get(address, 0) + 1


@dataclass(frozen=True, slots=True)
class _Read:
    """What this server reads at one sync: the view, and each fresh node's record with
    its pending writes applied, in node-name order."""

    view: FleetView
    records: tuple[tuple[str, NodeRecord], ...]
    by_node: Mapping[str, NodeRecord]


class SandboxStore:
    """One per process: every service of a process reads the fleet through it."""

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
        self._source = source
        self._rule = rule
        self._clock = clock or SystemClock()
        self._nodes = nodes  # None: no claim routing, lookups read inventories only
        self._index = OwnerIndex()
        self._stats = ReadStats()
        self._rng = rng or random.Random()
        self._ledger = Ledger(retain, first_version)
        self._writes = PendingWrites(write_bound or rule.stale_after)
        self._lists = ListStates(self._clock.monotonic)
        self._pages: dict[KeyOf, SortedIndex] = {}
        self._sync_lock = threading.Lock()
        self._read: tuple[tuple[object, ...], _Read] | None = None

    def close(self) -> None:
        """Close the connections to nodes (the source belongs to the caller)."""
        if self._nodes is not None:
            self._nodes.close()

    # --- what this server reads ----------------------------------------------------------

    @property
    def stats(self) -> ReadStats:
        self._stats.rescans = self._ledger.rescans
        return self._stats

    @property
    def routes_claims(self) -> bool:
        """Whether this store can reach the nodes (claims, verbs, live lookups)."""
        return self._nodes is not None

    def now(self) -> datetime:
        return self._clock.now()

    def sync(self) -> _Read:
        """What this server reads now, with the ledger brought up to it (the source's
        snapshot and this server's writes); cheap when neither changed since the last
        call."""
        return self._current(ledger=True)

    def _current(self, ledger: bool = False) -> _Read:
        """What this server reads now: the fresh nodes' records with its pending writes
        applied. The ledger (objects, versions, the change log) is brought up to it only
        for ``ledger``: the e2b API and the proxy never need the Kubernetes objects, so
        they never pay for building them."""
        view = self._source.snapshot().view(self._rule, self._clock.now(), self._clock.monotonic())
        with self._sync_lock:  # one at a time: the ledger must never go back to older inputs
            snapshot = view.snapshot
            if len(self._writes):
                self._writes.settle(snapshot.record, self._clock.monotonic())
            inputs = (snapshot, view.rule.cutoff(view.reference), self._writes.version)
            last = self._read
            if last is not None and _same(last[0], inputs):
                read = dataclasses.replace(last[1], view=view)
            else:
                records = tuple(
                    (node, self._writes.apply(node, record))
                    for node in view.fresh_nodes()
                    if (record := snapshot.record(node)) is not None
                )
                read = _Read(view, records, dict(records))
                self._read = (inputs, read)
            if ledger:
                self._ledger.sync(inputs, lambda: read.records)
            return read

    def state(self) -> State:
        """Every object at the ledger's current version."""
        self.sync()
        return self._ledger.state()

    def changes_since(self, version: int) -> list[Change]:
        self.sync()
        return self._ledger.since(version)

    def check_version(self, version: int) -> None:
        """Raise Expired unless a watch can resume from ``version``."""
        self.sync()
        self._ledger.check(version)

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` after each sync that logged a change (from that thread)."""
        return self._ledger.subscribe(listener)

    def retained_changes(self) -> int:
        return self._ledger.retained()

    def fresh_nodes(self) -> list[str]:
        return [node for node, _ in self._current().records]

    def address(self, node: str) -> str | None:
        """A fresh node's advertised address; None when it is stale, unknown or has none."""
        inventory = self._current().view.inventory(node)
        return inventory.address if inventory is not None and inventory.address else None

    def has_template(self, template: str) -> bool:
        """Whether a fresh node serves ``template`` (lists it, or has a pool of it)."""
        return any(serves(record.inventory, template) for _, record in self._current().records)

    def templates(self) -> builtins.list[str]:
        """Every template a fresh node serves (lists, or has a pool of), sorted."""
        names = {
            str(t.get("template"))
            for _, record in self._current().records
            for t in record.inventory.templates
            if t.get("template")
        }
        names.update(
            pool.key.template
            for _, record in self._current().records
            for pool in record.inventory.pools
        )
        return sorted(names)

    def template_entries(self) -> dict[str, Mapping[str, Any]]:
        """Each template a fresh node lists, with what that node says of it (its build,
        for one built from Debian packages); where nodes differ, the newest build wins."""
        found: dict[str, Mapping[str, Any]] = {}
        for _, record in self._current().records:
            for entry in record.inventory.templates:
                name = str(entry.get("template") or "")
                if name and _newer_build(entry, found.get(name)):
                    found[name] = entry
        return found

    def warm_candidates(self, key: PoolKey) -> list[WarmCandidate]:
        return self._current().view.warm_candidates(key)

    # --- lists, watches and pages ----------------------------------------------------

    def list(
        self, query: Query, limit: int | None = None, continue_token: str | None = None
    ) -> ListPage:
        """One page of the objects matching the query, sorted by (namespace, name), from
        one consistent state: the current one, or the one ``continue_token`` names."""
        current = self.state()
        if continue_token:
            state, after = self._lists.resume(continue_token, current)
        else:
            state, after = current, None
        return self._lists.page(state, query, after, limit)

    def watch(
        self,
        query: Query,
        resource_version: int | None = None,
        send_initial_events: bool = False,
    ) -> Watch:
        return Watch(self, query, resource_version, send_initial_events)

    def page(
        self,
        namespace: str,
        key: KeyOf,
        accepts: Callable[[Entry], bool],
        cursor: Any,
        descending: bool,
        limit: int | None,
    ) -> tuple[builtins.list[Located], Any, datetime]:
        """Sandboxes of a namespace ordered by ``key`` (a function of the entry kept for
        the store's life), after ``cursor``; the cursor of the next page (see ``pages``);
        and the time of the read. The e2b listing reads this."""
        read = self._current()
        with self._sync_lock:
            index = self._pages.setdefault(key, SortedIndex(key))
        found, following = index.page(read.records, namespace, accepts, cursor, descending, limit)
        return found, following, read.view.now

    def object_of(self, located: Located) -> dict[str, Any]:
        """The served object for a located sandbox: the ledger's when it holds that very
        entry, else one made now at the current version."""
        self.sync()
        state = self._ledger.state()
        held = state.held.get(located.entry.namespaced_name)
        if held is not None and held.located == located:
            return held.object
        return sandbox_object(located, str(state.version))

    def version_of(self, namespace: str, name: str) -> str:
        """The resourceVersion this server reads a name at (the current one if absent)."""
        state = self.state()
        held = state.held.get((namespace, name))
        return str(held.version if held is not None else state.version)

    # --- lookups -------------------------------------------------------------------------

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        located = self.locate(namespace, name)
        if located is None:
            raise NotFound(f'sandboxes "{name}"')
        return self.object_of(located)

    def locate(self, namespace: str, name: str) -> Located | None:
        read = self._current()
        # The first node holding it, as the ledger reads it: the inventories' holders, and
        # the nodes with pending writes (which may hold it only in this server's eyes).
        holders = {found.node for found in read.view.lookup_name(namespace, name)}
        for holder in sorted(holders | self._writes.nodes()):
            record = read.by_node.get(holder)
            entry = record.by_name.get((namespace, name)) if record is not None else None
            if entry is not None:
                return Located(holder, entry)
        node = self._index.name(namespace, name)
        if node is not None:
            found = self._live_on(
                read, node, lambda c: self._live_by_name(c, node, namespace, name)
            )
            if found is not None:
                return found
        if self._nodes is not None:
            found = self._fan_out(read, lambda c, n: self._live_by_name(c, n, namespace, name))
            if found is not None:
                self._index.remember_name(namespace, name, found.node)
                return found
        return None

    def locate_claim(
        self,
        claim_id: str,
        namespace: str | None = None,
        match: Callable[[str], bool] | None = None,
        *,
        ask_nodes: bool = True,
    ) -> Located | None:
        """A sandbox by claim id. ``match`` widens equality (e.g. the e2b id spelling);
        ``ask_nodes`` False reads only what this server holds, never an agent."""
        read = self._current()
        accepts = match or (lambda candidate: candidate == claim_id)

        def wanted(located: Located) -> bool:
            ns, _ = located.entry.namespaced_name
            return (
                bool(located.entry.id)
                and accepts(located.entry.id)
                and (namespace is None or ns == namespace)
            )

        found = self._held_claim(read, claim_id)
        if found is not None:
            return found if wanted(found) else None
        if match is not None:  # another spelling: the index by id cannot answer, sweep
            for holder, record in read.records:
                for entry in record.inventory.entries:
                    if wanted(located := Located(holder, entry)):
                        return located
        if not ask_nodes or self._nodes is None:
            return None
        owner = self._index.claim(namespace or "", claim_id)
        if owner is not None:
            found = self._live_on(read, owner, lambda c: self._live_by_id(c, owner, claim_id))
            if found is not None and wanted(found):
                return found
        found = self._fan_out(read, lambda c, n: self._live_by_id(c, n, claim_id))
        if found is not None and wanted(found):
            self._index.remember_claim(namespace or "", claim_id, found.node)
            return found
        return None

    def probe(self, claim_ids: Sequence[str]) -> tuple[Located, SandboxRow] | None:
        """Ask every fresh node's agent for any of ``claim_ids`` (spellings of one id);
        the first node that has it answers with its live row (with the claim token)."""
        nodes = self._routing()
        read = self._current()
        targets = self._targets(read)
        by_address = {address: node for node, address in targets}

        def ask(client: AgentClient) -> tuple[Located, SandboxRow] | None:
            for claim_id in claim_ids:
                try:
                    row = client.get(claim_id)
                except AgentError as error:
                    if error.status != 404:
                        raise
                    continue
                return Located(by_address[client.address], entry_from_row(row)), row
            return None

        return nodes.first_hit([address for _, address in targets], ask)

    def _held_claim(self, read: _Read, claim_id: str) -> Located | None:
        """The claim as this server reads it: its pending write, else the inventories."""
        pending = self._writes.find(claim_id)
        if pending is not None:
            node, entry = pending
            if entry is None or node not in read.by_node:
                return None
            return Located(node, entry)
        return read.view.lookup_claim_id(claim_id)

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
        network: NetworkPolicy | None = None,
    ) -> Assignment:
        """Place a claim by power of two choices over fresh warm capacity; when no warm
        candidate takes it, start one cold on the node with the most free slots (this
        server's own claims and releases counted), then the next.

        ``env`` is the sandbox's environment for the commands envd starts in it; the
        owning agent validates and stores it, and never lists it. ``network`` is its
        network policy (None: what ``key.net`` says); the claim's net is no pool
        dimension, so the candidates are those of ``key.pool``.

        Raises NoNodeCapacity when every node that serves the template is full, the
        node's refusal (NodeRefused) for a 4xx it gives, and NodeUnavailable when a
        request timed out after it went out (it may have been granted, so it is never
        retried)."""
        nodes = self._routing()
        read = self._current()
        candidates = read.view.warm_candidates(key.pool)
        request = ClaimRequest(
            template=key.template,
            net=key.net,
            size=key.size,
            ttl_seconds=ttl_seconds,
            claim_ref=f"{namespace}/{name}",
            metadata=dict(metadata or {}),
            on_expire=on_expire,
            env=dict(env or {}),
            network=UNSET if network is None else ClaimedPolicy.of(network),
        )
        # A cold start of a template with a ready command waits for it (startup.py).
        waits = bool(self.template_entries().get(key.template, {}).get("readyCmd"))
        timeout = READY_TIMEOUT + CLAIM_SLACK if waits else None

        def attempt(candidate: WarmCandidate | ColdCandidate) -> Outcome[ClaimGrant]:
            try:
                return Delivered(nodes.client(candidate.address, timeout).claim(request))
            except AgentApiError as error:
                if undelivered(error):
                    return Undelivered(str(error))
                if isinstance(error, AgentError) and error.status == 404:
                    # On a claim the node's 404 is about the template, not a sandbox.
                    return Failed(NodeRefused(404, error.message))
                return Failed(_translate(error))

        chosen: WarmCandidate | ColdCandidate
        try:
            chosen, granted = place(candidates, attempt, self._rng.randrange)
        except NoWarmCapacity:
            inventories = ((node, record.inventory) for node, record in read.records)
            chosen, granted = place_cold(key.template, cold_candidates(inventories, key), attempt)
        node = chosen.node
        self._index.remember_name(namespace, name, node)
        self._index.remember_claim(namespace, granted.id, node)
        self._index.remember_claim("", granted.id, node)
        if granted.sandbox:
            entry = entry_from_row(granted.sandbox)
        else:  # an agent from before grants carried the row
            entry = Entry(
                name=f"{namespace}/{name}",
                phase=RUNNING,
                id=granted.id,
                template=key.template,
                claim_ref=f"{namespace}/{name}",
                metadata=Metadata.of(dict(metadata or {})),
                deadline=granted.deadline,
                claimed_at=self._clock.now().replace(microsecond=0),
            )
        self._wrote(node, entry.id, entry)
        return Assignment(
            claim_id=granted.id,
            node=node,
            address=chosen.address,
            token=granted.token,
            deadline=granted.deadline,
            located=Located(node, entry),
        )

    def release(self, located: Located) -> None:
        """Release on the owning node; an already released sandbox counts as released."""
        client = self._owner(located)
        try:
            client.release(located.entry.id)
        except AgentError as error:
            if error.status != 404:
                raise _translate(error) from error
        except AgentApiError as error:
            raise _translate(error) from error
        namespace, name = located.entry.namespaced_name
        self._index.forget(namespace, name, located.entry.id)
        self._wrote(located.node, located.entry.id, None)

    def renew(self, located: Located, ttl_seconds: int) -> datetime | None:
        reply = self._verb(located, lambda c: c.renew(located.entry.id, ttl_seconds))
        self._rewrote(located, deadline=reply.deadline)
        deadline: datetime | None = reply.deadline
        return deadline

    def set_network(self, located: Located, update: NetworkUpdate) -> None:
        """Replace a sandbox's egress rules on its node."""
        self._verb(located, lambda c: c.set_network(located.entry.id, update))

    def pause(self, located: Located) -> None:
        self._verb(located, lambda c: c.hibernate(located.entry.id))
        self._rewrote(located, phase=HIBERNATED)

    def resume(self, located: Located) -> None:
        self._verb(located, lambda c: c.wake(located.entry.id))
        self._rewrote(located, phase=RUNNING)

    def read(self, located: Located) -> SandboxRow:
        """The owning node's live row for a sandbox, with its claim token."""
        reply = self._verb(located, lambda c: c.get(located.entry.id))
        assert isinstance(reply, SandboxRow)
        return reply

    def usage(
        self,
        located: Located,
        start: float | None = None,
        end: float | None = None,
        latest: bool = False,
    ) -> builtins.list[UsageSample]:
        """The owning node's usage samples of a sandbox, oldest first (only the newest
        with ``latest``); NotFound once it is gone."""
        claim_id = located.entry.id
        samples: builtins.list[UsageSample] = self._verb(
            located, lambda c: c.usage(claim_id, start, end, latest=latest)
        )
        return samples

    def log_of(self, claim_ids: Sequence[str], namespace: str) -> SandboxLog | None:
        """The log of a sandbox of ``namespace`` by any spelling of its claim id, live
        or destroyed (its node keeps the log of a killed sandbox a while): every fresh
        node is asked; None when none has it for that namespace, or this store cannot
        reach the nodes."""
        nodes = self._nodes
        if nodes is None:
            return None
        targets = self._targets(self._current())

        def ask(client: AgentClient) -> SandboxLog | None:
            for claim_id in claim_ids:
                try:
                    found = client.log(claim_id)
                except AgentError as error:
                    if error.status != 404:
                        raise
                    continue
                if found.claim_ref.partition("/")[0] == namespace:
                    return found
            return None

        return nodes.first_hit([address for _, address in targets], ask)

    # --- internals -------------------------------------------------------------------

    def _wrote(self, node: str, claim_id: str, entry: Entry | None) -> None:
        record = self._source.snapshot().record(node)
        self._writes.wrote(node, claim_id, entry, record, self._clock.monotonic())
        if self._ledger.synced:  # log the change now, and wake the watches
            self.sync()

    def _rewrote(self, located: Located, **changes: Any) -> None:
        current = self._held_claim(self._current(), located.entry.id) or located
        changed = msgspec.structs.replace(current.entry, **changes)
        self._wrote(located.node, located.entry.id, changed)

    def _routing(self) -> NodeAccess:
        if self._nodes is None:
            raise ClaimRoutingOff("claims need the fleet's root token (--sandboxd-token-file)")
        return self._nodes

    def _owner(self, located: Located) -> AgentClient:
        nodes = self._routing()
        address = self.address(located.node)
        if address is None:
            raise NotFound(f'sandbox "{located.entry.name}"')  # its node went stale
        return nodes.client(address)

    def _verb(self, located: Located, call: Callable[[AgentClient], Any]) -> Any:
        client = self._owner(located)
        try:
            return call(client)
        except AgentApiError as error:
            raise _translate(error) from error

    def _live_on(
        self, read: _Read, node: str, ask: Callable[[AgentClient], Located | None]
    ) -> Located | None:
        if self._nodes is None:
            return None
        inventory = read.view.inventory(node)  # None when stale: a stale node is never asked
        if inventory is None or not inventory.address:
            return None
        self._stats.asked(inventory.address)
        return self._nodes.first_hit([inventory.address], ask)

    def _targets(self, read: _Read) -> builtins.list[tuple[str, str]]:
        """(node, address) of every fresh node with an address."""
        targets = []
        for node, record in read.records:
            if record.inventory.address:
                targets.append((node, record.inventory.address))
        for _, address in targets:
            self._stats.asked(address)
        return targets

    def _fan_out(
        self, read: _Read, ask: Callable[[AgentClient, str], Located | None]
    ) -> Located | None:
        assert self._nodes is not None
        targets = self._targets(read)
        by_address = {address: node for node, address in targets}
        return self._nodes.first_hit(
            [address for _, address in targets],
            lambda client: ask(client, by_address[client.address]),
        )

    @staticmethod
    def _live_by_name(client: AgentClient, node: str, namespace: str, name: str) -> Located | None:
        for row in client.sandboxes(claim_ref=f"{namespace}/{name}"):
            entry = entry_from_row(row)
            if entry.namespaced_name == (namespace, name):  # a node may ignore the filter
                return Located(node, entry)
        return None

    @staticmethod
    def _live_by_id(client: AgentClient, node: str, claim_id: str) -> Located | None:
        try:
            row = client.get(claim_id)
        except AgentError as error:
            if error.status == 404:
                return None
            raise
        return Located(node, entry_from_row(row))


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return all(x is y or x == y for x, y in zip(a, b, strict=True))


def _translate(error: Exception) -> Exception:
    if isinstance(error, AgentError):
        if error.status == 404:
            return NotFound(f"sandbox ({error.message})")
        if 400 <= error.status < 500:
            return NodeRefused(error.status, error.message)
        return NodeUnavailable(str(error))
    return NodeUnavailable(f"node did not answer: {error}")


def _newer_build(entry: Mapping[str, Any], than: Mapping[str, Any] | None) -> bool:
    """A template entry with a build is newer than one without; else by ``createdAt``."""
    if than is None:
        return True
    return (bool(entry.get("digest")), str(entry.get("createdAt") or "")) > (
        bool(than.get("digest")),
        str(than.get("createdAt") or ""),
    )

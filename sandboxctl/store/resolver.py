"""The owner resolver: which fresh node holds a sandbox, for every API of a process.

The Sandbox API (by name), the e2b API (by id, either spelling) and the envd proxy (by id,
with the claim token) all resolve through it, in this order (each step only when the one
before missed):

1. what this server reads: the inventories with its pending writes applied;
2. the owner this server remembers (``owners``: one memory, one policy), asked live;
3. every fresh node's agent, live (a claim another replica made since the last publish);
   a hit is remembered, so the next lookup asks only the node that holds it.

Every node asked is one the fleet reads show fresh, at the address its inventory
advertises, so a stale node receives no request at all. A call to the node that owns a
sandbox (``call_owner``) goes through here too, so the node saying it is gone forgets it.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Callable, Sequence
from typing import TypeVar

from sandboxctl.agentapi import AgentApiError, AgentClient, AgentError, SandboxLog, SandboxRow
from sandboxctl.agentapi.mapping import entry_from_row
from sandboxctl.core.errors import SandboxctlError
from sandboxctl.core.ids import SandboxId
from sandboxctl.core.snapshot import Located
from sandboxctl.store.errors import ClaimRoutingOff, NodeRefused, NodeUnavailable, NotFound
from sandboxctl.store.nodes import NodeAccess
from sandboxctl.store.owners import Key, Owner, Owners
from sandboxctl.store.reads import FleetReads, Read

T = TypeVar("T")


class OwnerResolver:
    """One per process, over its fleet reads. Without ``nodes`` (no fleet token) it asks
    no node: lookups read the inventories only."""

    def __init__(self, reads: FleetReads, nodes: NodeAccess | None = None) -> None:
        self._reads = reads
        self._nodes = nodes

    @property
    def owners(self) -> Owners:
        return self._reads.owners

    @property
    def routes_claims(self) -> bool:
        """Whether the nodes can be reached (claims, verbs, live lookups)."""
        return self._nodes is not None

    def node_access(self) -> NodeAccess:
        """The access to the nodes; ClaimRoutingOff without the fleet token."""
        if self._nodes is None:
            raise ClaimRoutingOff("claims need the fleet's root token (--sandboxd-token-file)")
        return self._nodes

    def close(self) -> None:
        """Close the connections to nodes."""
        if self._nodes is not None:
            self._nodes.close()

    # --- lookups -------------------------------------------------------------------------

    def locate(self, namespace: str, name: str) -> Located | None:
        """A sandbox by name."""
        read = self._reads.current()
        found = self._reads.held_name(namespace, name, read)
        if found is not None:
            return found
        key = (namespace, name)
        owner = self.owners.get(key)
        if owner is not None:
            found = self._live_on(read, owner.node, lambda c: _live_by_name(c, owner.node, key))
            if found is not None:
                return found
        found = self._fan_out(read, lambda c, n: _live_by_name(c, n, key))
        if found is not None:
            self._remember(read, key, found)
        return found

    def locate_claim(
        self, sandbox_id: SandboxId, namespace: str | None = None, *, ask_nodes: bool = True
    ) -> Located | None:
        """A sandbox by id (either spelling), of ``namespace`` when given; ``ask_nodes``
        False reads only what this server holds, never an agent."""
        read = self._reads.current()

        def wanted(located: Located) -> bool:
            ns, _ = located.entry.namespaced_name
            return (
                bool(located.entry.id)
                and sandbox_id.names(located.entry.id)
                and (namespace is None or ns == namespace)
            )

        owner = self.owners.get(sandbox_id)
        claim_id = owner.claim_id if owner is not None else sandbox_id.claim
        found = self._reads.held_claim(claim_id, read)
        if found is not None:
            return found if wanted(found) else None
        # An id whose claim spelling the public one does not tell: every entry is read.
        found = next(filter(wanted, self._reads.entries(read)), None)
        if found is not None or not ask_nodes or self._nodes is None:
            return found
        if owner is not None:
            found = self._live_on(read, owner.node, lambda c: _live_by_id(c, owner.node, claim_id))
            if found is not None and wanted(found):
                return found
        found = self._fan_out(read, lambda c, n: _live_by_id(c, n, claim_id))
        if found is not None and wanted(found):
            self._remember(read, sandbox_id, found)
            return found
        return None

    def _probe(self, sandbox_id: SandboxId) -> tuple[Located, SandboxRow] | None:
        """Ask every fresh node's agent for the sandbox (each spelling of its id); the
        first node that has it answers with its live row (with the claim token)."""
        nodes = self.node_access()
        targets = self._targets(self._reads.current())
        by_address = {address: node for node, address in targets}

        def ask(client: AgentClient) -> tuple[Located, SandboxRow] | None:
            row = _first_row(client.get, sandbox_id.spellings)
            if row is None:
                return None
            return Located(by_address[client.address], entry_from_row(row)), row

        return nodes.first_hit([address for _, address in targets], ask)

    def cached_owner(self, sandbox_id: SandboxId) -> Owner | None:
        """The remembered owner with its claim token, while its node is fresh at the same
        address and no other node lists the sandbox; no I/O (the envd proxy's hot path)."""
        owner = self.owners.get(sandbox_id)
        if owner is None or not owner.token:
            return None
        read = self._reads.latest()  # never waits on a sync: the event loop calls this
        held = self._reads.held_claim(owner.claim_id, read)
        moved = held is not None and held.node != owner.node
        inventory = read.view.inventory(owner.node)  # None once stale
        if moved or inventory is None or inventory.address != owner.address:
            self.owners.forget(sandbox_id)
            return None
        return owner

    def owner(
        self, sandbox_id: SandboxId, may_probe: Callable[[], bool] = lambda: True
    ) -> Owner | None:
        """The owner of a sandbox with its claim token: remembered with it, else the
        node the inventories name, else the node remembered without it (an e2b lookup's),
        each asked for its live row; else, when ``may_probe()`` allows, the node a probe
        of every fresh node finds. None when no fresh node holds it or a node could not
        say."""
        found = self.cached_owner(sandbox_id)
        if found is not None:
            return found
        try:
            hit = self._live_row(sandbox_id, may_probe)
        except SandboxctlError:
            return None
        if hit is None:
            return None
        node, row = hit
        address = self._reads.address(node)
        if address is None or not row.token:
            return None
        owner = Owner(node, address, row.id).with_row(row)
        return self._remember(
            self._reads.current(), sandbox_id, Located(node, entry_from_row(row)), owner
        )

    def forget(self, sandbox_id: SandboxId) -> None:
        """Forget the sandbox's owner (its node refused the claim token, or failed)."""
        self.owners.forget(sandbox_id)

    def forget_sandbox(self, located: Located) -> None:
        """Forget a sandbox's owner by its name and its id (released, or gone)."""
        self.owners.forget(located.entry.namespaced_name, SandboxId.of_claim(located.entry.id))

    def call_owner(self, located: Located, call: Callable[[AgentClient], T]) -> T:
        """``call`` on the agent of the node that owns a sandbox, its errors as the store
        raises them; the owner is forgotten when the node says the sandbox is gone."""
        address = self._reads.address(located.node)
        if address is None:
            raise NotFound(f'sandbox "{located.entry.name}"')  # its node went stale
        client = self.node_access().client(address)
        try:
            return call(client)
        except AgentApiError as error:
            translated = translated_error(error)
            if isinstance(translated, NotFound):  # gone on its node: killed, expired
                self.forget_sandbox(located)
            raise translated from error

    def row_of(self, located: Located) -> SandboxRow:
        """The owning node's live row for a sandbox, with its claim token."""
        return self.call_owner(located, lambda c: c.get(located.entry.id))

    def log_of(self, sandbox_id: SandboxId, namespace: str) -> SandboxLog | None:
        """The log of a sandbox of ``namespace``, live or destroyed (its node keeps the
        log of a killed sandbox a while): every fresh node is asked, for each spelling
        of its id; None when none has it for that namespace, or no node can be asked."""
        nodes = self._nodes
        if nodes is None:
            return None
        owner = self.owners.get(sandbox_id)
        known = (owner.claim_id,) if owner is not None else ()
        spellings = tuple(dict.fromkeys((*known, *sandbox_id.spellings)))
        targets = self._targets(self._reads.current())

        def ask(client: AgentClient) -> SandboxLog | None:
            for spelling in spellings:
                found = _first_row(client.log, (spelling,))
                if found is not None and found.claim_ref.partition("/")[0] == namespace:
                    return found
            return None

        return nodes.first_hit([address for _, address in targets], ask)

    # --- internals -------------------------------------------------------------------

    def _live_row(
        self, sandbox_id: SandboxId, may_probe: Callable[[], bool]
    ) -> tuple[str, SandboxRow] | None:
        """The owning node and its live row of a sandbox, for ``owner``. When the node the
        reads name fails or no longer has it (it moved; its publish lags), the next steps
        still run, as the proxy always did: the remembered node, then the probe."""
        located = self.locate_claim(sandbox_id, ask_nodes=False)
        failed = None
        if located is not None:
            try:
                return located.node, self.row_of(located)
            except SandboxctlError:  # a 404 also forgot the remembered owner
                failed = located.node
        remembered = self.owners.get(sandbox_id)
        if remembered is not None and remembered.node != failed:
            node, claim_id = remembered.node, remembered.claim_id
            row = self._live_on(
                self._reads.current(), node, lambda c: _first_row(c.get, (claim_id,))
            )
            if row is not None:
                return node, row
        if may_probe() and (hit := self._probe(sandbox_id)) is not None:
            return hit[0].node, hit[1]
        return None

    def _remember(
        self, read: Read, key: Key, located: Located, owner: Owner | None = None
    ) -> Owner:
        """Remember the owner of a sandbox found by ``key`` (its node's, when not given);
        listed when the node's own inventory lists it (not merely a pending write)."""
        record = read.inventories.get(located.node)
        listed = record is not None and located.entry.id in record.by_id
        if owner is None:
            address = self._reads.address(located.node) or ""
            owner = Owner(located.node, address, located.entry.id)
        owner = dataclasses.replace(owner, listed=listed)
        self.owners.remember(owner, key)
        return owner

    def _live_on(self, read: Read, node: str, ask: Callable[[AgentClient], T | None]) -> T | None:
        if self._nodes is None:
            return None
        inventory = read.view.inventory(node)  # None when stale: a stale node is never asked
        if inventory is None or not inventory.address:
            return None
        self._reads.stats.asked(inventory.address)
        return self._nodes.first_hit([inventory.address], ask)

    def _targets(self, read: Read) -> builtins.list[tuple[str, str]]:
        """(node, address) of every fresh node with an address."""
        targets = []
        for node, record in read.records:
            if record.inventory.address:
                targets.append((node, record.inventory.address))
        for _, address in targets:
            self._reads.stats.asked(address)
        return targets

    def _fan_out(
        self, read: Read, ask: Callable[[AgentClient, str], Located | None]
    ) -> Located | None:
        if self._nodes is None:
            return None
        targets = self._targets(read)
        by_address = {address: node for node, address in targets}
        return self._nodes.first_hit(
            [address for _, address in targets],
            lambda client: ask(client, by_address[client.address]),
        )


def _live_by_name(client: AgentClient, node: str, name: tuple[str, str]) -> Located | None:
    namespace, short = name
    for row in client.sandboxes(claim_ref=f"{namespace}/{short}"):
        entry = entry_from_row(row)
        if entry.namespaced_name == name:  # a node may ignore the filter
            return Located(node, entry)
    return None


def _live_by_id(client: AgentClient, node: str, claim_id: str) -> Located | None:
    row = _first_row(client.get, (claim_id,))
    return Located(node, entry_from_row(row)) if row is not None else None


def _first_row(ask: Callable[[str], T], spellings: Sequence[str]) -> T | None:
    """What the agent answers for the first spelling it knows; None when it knows none."""
    for spelling in spellings:
        try:
            return ask(spelling)
        except AgentError as error:
            if error.status != 404:
                raise
    return None


def translated_error(error: Exception) -> Exception:
    """An agent call's error as the store raises it."""
    if isinstance(error, AgentError):
        if error.status == 404:
            return NotFound(f"sandbox ({error.message})")
        if 400 <= error.status < 500:
            return NodeRefused(error.status, error.message)
        return NodeUnavailable(str(error))
    return NodeUnavailable(f"node did not answer: {error}")

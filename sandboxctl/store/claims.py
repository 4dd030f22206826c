"""Claim routing: claims, and the verbs on a claimed sandbox, on the node that owns it.

A claim is placed over the fleet reads' fresh warm capacity (else a cold start); a verb
goes to the node the owner resolver names. What a node answers is recorded in the fleet
reads at once (``FleetReads.wrote``), so this server's next read shows it.
"""

from __future__ import annotations

import builtins
import random
from collections.abc import Mapping
from datetime import datetime
from typing import Final

from msgspec import UNSET

from sandboxctl.agentapi import (
    AgentApiError,
    AgentClient,
    AgentError,
    ClaimGrant,
    ClaimRequest,
    UsageSample,
)
from sandboxctl.agentapi.mapping import HIBERNATED, RUNNING, entry_from_row
from sandboxctl.agentapi.models import ClaimedPolicy
from sandboxctl.agentapi.network import NetworkUpdate
from sandboxctl.core.ids import SandboxId
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
)
from sandboxctl.core.snapshot import Located, WarmCandidate
from sandboxctl.core.templates import READY_TIMEOUT
from sandboxctl.store.assignment import Assignment
from sandboxctl.store.errors import NodeRefused
from sandboxctl.store.nodes import undelivered
from sandboxctl.store.owners import Owner
from sandboxctl.store.reads import FleetReads
from sandboxctl.store.resolver import OwnerResolver, translated_error

CLAIM_SLACK: Final = 10.0  # beyond a template's ready wait: the start itself and the answer


class ClaimRouter:
    """One per process, over its fleet reads and owner resolver."""

    def __init__(
        self, reads: FleetReads, resolver: OwnerResolver, rng: random.Random | None = None
    ) -> None:
        self._reads = reads
        self._resolver = resolver
        self._rng = rng or random.Random()

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
        nodes = self._resolver.node_access()
        read = self._reads.current()
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
        waits = bool(self._reads.template_entries().get(key.template, {}).get("readyCmd"))
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
                return Failed(translated_error(error))

        chosen: WarmCandidate | ColdCandidate
        try:
            chosen, granted = place(
                read.view.warm_candidates(key.pool), attempt, self._rng.randrange
            )
        except NoWarmCapacity:
            inventories = ((node, record.inventory) for node, record in read.records)
            chosen, granted = place_cold(key.template, cold_candidates(inventories, key), attempt)
        entry = self._granted_entry(granted, namespace, name, key, metadata)
        owner = Owner(chosen.node, chosen.address, granted.id)  # no inventory lists it yet
        self._resolver.owners.remember(owner, (namespace, name), SandboxId.of_claim(granted.id))
        self._reads.wrote(chosen.node, entry.id, entry)
        return Assignment(
            claim_id=granted.id,
            node=chosen.node,
            address=chosen.address,
            token=granted.token,
            deadline=granted.deadline,
            located=Located(chosen.node, entry),
        )

    def release(self, located: Located) -> None:
        """Release on the owning node; an already released sandbox counts as released."""

        def release(client: AgentClient) -> None:
            try:
                client.release(located.entry.id)
            except AgentError as error:
                if error.status != 404:
                    raise

        self._resolver.call_owner(located, release)
        self._resolver.forget_sandbox(located)
        self._reads.wrote(located.node, located.entry.id, None)

    def renew(self, located: Located, ttl_seconds: int) -> datetime | None:
        reply = self._resolver.call_owner(located, lambda c: c.renew(located.entry.id, ttl_seconds))
        self._reads.rewrote(located, deadline=reply.deadline)
        deadline: datetime | None = reply.deadline
        return deadline

    def set_network(self, located: Located, update: NetworkUpdate) -> None:
        """Replace a sandbox's egress rules on its node."""
        self._resolver.call_owner(located, lambda c: c.set_network(located.entry.id, update))

    def pause(self, located: Located) -> None:
        self._resolver.call_owner(located, lambda c: c.hibernate(located.entry.id))
        self._reads.rewrote(located, phase=HIBERNATED)

    def resume(self, located: Located) -> None:
        self._resolver.call_owner(located, lambda c: c.wake(located.entry.id))
        self._reads.rewrote(located, phase=RUNNING)

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
        samples: builtins.list[UsageSample] = self._resolver.call_owner(
            located, lambda c: c.usage(claim_id, start, end, latest=latest)
        )
        return samples

    # --- internals -------------------------------------------------------------------

    def _granted_entry(
        self,
        granted: ClaimGrant,
        namespace: str,
        name: str,
        key: PoolKey,
        metadata: Mapping[str, str] | None,
    ) -> Entry:
        if granted.sandbox:
            return entry_from_row(granted.sandbox)
        return Entry(  # an agent from before grants carried the row
            name=f"{namespace}/{name}",
            phase=RUNNING,
            id=granted.id,
            template=key.template,
            claim_ref=f"{namespace}/{name}",
            metadata=Metadata.of(dict(metadata or {})),
            deadline=granted.deadline,
            claimed_at=self._reads.now().replace(microsecond=0),
        )

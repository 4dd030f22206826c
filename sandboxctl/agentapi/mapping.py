"""The one mapping from a sandboxd agent's answers to the inventory model.

Mesh mode, the store's live lookups and the e2b API all read the same two answers
(:class:`AgentInfo` and the :class:`SandboxRow` list); this module is the only place that
turns them into :class:`NodeInventory`, :class:`Pool` and :class:`Entry` values, so every
reader sees one sandbox the same way. A bad answer has already failed in ``from_json``,
naming the field; what is left here is what the inventory needs beyond the API.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sandboxctl.agentapi.errors import AgentAnswerError
from sandboxctl.agentapi.models import AgentInfo, SandboxRow, time_of
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.model import Entry, Metadata, NodeInventory, Pool, in_utc
from sandboxctl.core.timestamps import format_rfc3339

RUNNING = "Running"
HIBERNATED = "Hibernated"
ADVERTISE_FIELD = "info.advertise_addr"


def entry_from_row(row: SandboxRow) -> Entry:
    """One sandbox row as an inventory entry.

    ``name`` (and ``claim_ref``) is the row's ``claim_ref``, or its id when that is empty;
    a hibernated (or archived) row is ``Hibernated``, any other ``Running``; ``metadata``
    is the row's own mapping; times are in UTC, Go's zero time none.
    """
    name = row.claim_ref or row.id
    entry = Entry(
        name=name,
        phase=HIBERNATED if row.hibernated or row.archived else RUNNING,
        id=row.id,
        template=row.key.template,
        claim_ref=name,
        metadata=Metadata.of(row.metadata),
        deadline=time_of(row.deadline),
        claimed_at=time_of(row.claimed_at),
        cpu_count=row.cpu_count,
        memory_bytes=row.mem_total_bytes,
    )
    return in_utc(entry)


def pools_from_info(info: AgentInfo) -> tuple[Pool, ...]:
    """The warm pools an info answer reports, in the agent's order."""
    return tuple(Pool(key=pool.key, warm=pool.warm, target=pool.target) for pool in info.pools)


def inventory_from_agent(
    info: AgentInfo, rows: Sequence[SandboxRow], published_at: datetime
) -> NodeInventory:
    """One node's inventory from its info answer and its sandbox rows.

    ``node`` is ``info.node``, ``address`` its ``advertise_addr``, which must not be empty:
    it is how the rest of the fleet reaches the node. Entries are sorted by name (then id).
    ``published_at`` is stamped by the caller: the time it received the answers.
    """
    if published_at.tzinfo is None:
        raise InvalidValueError("published_at needs a zone: pass an aware UTC datetime")
    if not info.advertise_addr:
        raise AgentAnswerError(ADVERTISE_FIELD, "required")
    entries = sorted(map(entry_from_row, rows), key=lambda entry: (entry.name, entry.id))
    return NodeInventory(
        node=info.node,
        address=info.advertise_addr,
        pools=pools_from_info(info),
        templates=templates_from_info(info),
        entries=tuple(entries),
        published_at=published_at,
        capacity=info.capacity or None,
    )


def templates_from_info(info: AgentInfo) -> tuple[dict[str, Any], ...]:
    """One inventory entry per served template: ``{"template": NAME}``, with the build
    of one built from Debian packages (``digest``, ``createdAt``, ``sizeBytes``,
    ``buildSeconds``, ``suite``, ``packages``, ``run``, ``startCmd``, ``readyCmd``)."""
    builds = {build.template: build for build in info.template_builds}
    entries: list[dict[str, Any]] = []
    for name in info.templates:
        build = builds.get(name)
        entry: dict[str, Any] = {"template": name}
        if build is not None:
            entry.update(
                digest=build.digest,
                createdAt=format_rfc3339(build.created_at),
                sizeBytes=build.size_bytes,
                buildSeconds=build.build_seconds,
                suite=build.suite,
                packages=list(build.packages),
                run=list(build.run),
                startCmd=build.start_cmd,
                readyCmd=build.ready_cmd,
            )
        entries.append(entry)
    return tuple(entries)

"""The agent API's JSON shapes, one frozen dataclass each, written once for both ends.

The agent builds its answers from these and reads its request bodies through them; the
client reads the answers through them and sends the requests. ``from_json`` raises
:class:`AgentAnswerError` naming the first field that does not fit; ``to_json`` gives the
exact JSON the agent serves (same fields, same order), so existing clients see no change.

Answers are read leniently, for agents older or newer than this one: an unknown field is
ignored and a missing optional one takes its default. Request bodies are read strictly
(an unknown field is an error), since a misspelt option must not pass as its default.
Times are aware UTC datetimes, written at second precision with ``Z``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sandboxctl.agentapi.fields import (
    at,
    nullable_str,
    optional_bool,
    optional_int,
    optional_list,
    optional_str,
    optional_time,
    pool_key,
    pool_key_json,
    read_object,
    refuse_unknown,
    required_int,
    required_list,
    required_str,
    string_map,
    time_json,
)
from sandboxctl.core.model import DEFAULT_NET, DEFAULT_SIZE, PoolKey

DESTROY = "destroy"
CLAIM_FIELDS = frozenset(
    {"template", "net", "size", "ttl_seconds", "claim_ref", "metadata", "on_expire", "env"}
    | {"no_redirect"}  # accepted from upstream clients and ignored: this agent never redirects
)

# --- GET /v1/info (and the answer to PUT /v1/pools) ----------------------------------------


@dataclass(frozen=True, slots=True)
class PoolStatus:
    """One warm pool: sandboxes ready now, the target, and starts in progress."""

    key: PoolKey
    warm: int
    target: int
    refilling: int = 0

    @classmethod
    def from_json(cls, value: object, path: str = "pool") -> PoolStatus:
        body = read_object(value, path)
        return cls(
            key=pool_key(body.get("key"), f"{path}.key"),
            warm=required_int(body.get("warm"), f"{path}.warm"),
            target=required_int(body.get("target"), f"{path}.target"),
            refilling=optional_int(body.get("refilling"), f"{path}.refilling") or 0,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "key": pool_key_json(self.key),
            "warm": self.warm,
            "target": self.target,
            "refilling": self.refilling,
        }


@dataclass(frozen=True, slots=True)
class AgentInfo:
    """What one agent reports about itself. ``advertise_addr`` is where the rest of the
    fleet reaches it; ``limits`` says how size limits are enforced (``cgroup-v1``,
    ``rlimit``)."""

    node: str
    advertise_addr: str = ""
    pools: tuple[PoolStatus, ...] = ()
    claimed: int = 0
    hibernated: int = 0
    capacity: int = 0
    at_capacity: bool = False
    runtime: str = ""
    limits: str = ""

    @classmethod
    def from_json(cls, value: object, path: str = "info") -> AgentInfo:
        body = read_object(value, path)
        pools = optional_list(body.get("pools"), f"{path}.pools")
        return cls(
            node=required_str(body.get("node"), f"{path}.node"),
            advertise_addr=optional_str(body.get("advertise_addr"), f"{path}.advertise_addr"),
            pools=tuple(
                PoolStatus.from_json(pool, f"{path}.pools[{i}]") for i, pool in enumerate(pools)
            ),
            claimed=optional_int(body.get("claimed"), f"{path}.claimed") or 0,
            hibernated=optional_int(body.get("hibernated"), f"{path}.hibernated") or 0,
            capacity=optional_int(body.get("capacity"), f"{path}.capacity") or 0,
            at_capacity=optional_bool(body.get("at_capacity"), f"{path}.at_capacity"),
            runtime=optional_str(body.get("runtime"), f"{path}.runtime"),
            limits=optional_str(body.get("limits"), f"{path}.limits"),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "advertise_addr": self.advertise_addr,
            "pools": [pool.to_json() for pool in self.pools],
            "claimed": self.claimed,
            "hibernated": self.hibernated,
            "capacity": self.capacity,
            "at_capacity": self.at_capacity,
            "runtime": self.runtime,
            "limits": self.limits,
        }


# --- GET /v1/sandboxes and GET /v1/sandboxes/{id} -------------------------------------------


@dataclass(frozen=True, slots=True)
class SandboxRow:
    """One claimed sandbox. ``token`` is only in the by-id answer; a claim's ``env`` is in
    no answer at all (its values may be secrets). ``archived`` is an upstream agent's
    paused-to-disk flag, read as hibernated; this agent never sets it."""

    id: str
    key: PoolKey
    deadline: datetime | None = None
    claimed_at: datetime | None = None
    hibernated: bool = False
    claim_ref: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    cpu_count: int | None = None
    mem_total_bytes: int | None = None
    token: str | None = None
    archived: bool = False

    @classmethod
    def from_json(cls, value: object, path: str = "") -> SandboxRow:
        body = read_object(value, path)
        return cls(
            id=required_str(body.get("id"), at(path, "id")),
            key=pool_key(body.get("key"), at(path, "key")),
            deadline=optional_time(body.get("deadline"), at(path, "deadline")),
            claimed_at=optional_time(body.get("claimed_at"), at(path, "claimed_at")),
            hibernated=optional_bool(body.get("hibernated"), at(path, "hibernated")),
            claim_ref=optional_str(body.get("claim_ref"), at(path, "claim_ref")),
            metadata=string_map(body.get("metadata"), at(path, "metadata")),
            cpu_count=optional_int(body.get("cpu_count"), at(path, "cpu_count")),
            mem_total_bytes=optional_int(body.get("mem_total_bytes"), at(path, "mem_total_bytes")),
            token=nullable_str(body.get("token"), at(path, "token")),
            archived=optional_bool(body.get("archived"), at(path, "archived")),
        )

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "key": pool_key_json(self.key),
            "deadline": time_json(self.deadline),
            "claimed_at": time_json(self.claimed_at),
            "hibernated": self.hibernated,
            "claim_ref": self.claim_ref,
            "metadata": dict(self.metadata),
            "cpu_count": self.cpu_count,
            "mem_total_bytes": self.mem_total_bytes,
        }
        if self.token is not None:
            body["token"] = self.token
        if self.archived:
            body["archived"] = True
        return body


@dataclass(frozen=True, slots=True)
class SandboxList:
    """The answer to ``GET /v1/sandboxes``: ``{"sandboxes": [row, ...]}``."""

    sandboxes: tuple[SandboxRow, ...] = ()

    @classmethod
    def from_json(cls, value: object, path: str = "") -> SandboxList:
        body = read_object(value, path)
        where = at(path, "sandboxes")
        rows = required_list(body.get("sandboxes"), where)
        return cls(tuple(SandboxRow.from_json(row, f"{where}[{i}]") for i, row in enumerate(rows)))

    def to_json(self) -> dict[str, Any]:
        return {"sandboxes": [row.to_json() for row in self.sandboxes]}


# --- POST /v1/claim -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """A claim of one sandbox of the pool key (``template``, ``net``, ``size``).

    ``ttl_seconds`` 0 means the agent's default lease; ``claim_ref`` is empty or
    ``<namespace>/<name>``; ``env`` is set by envd for every command in the sandbox and
    never listed (its values may be secrets)."""

    template: str
    net: str = DEFAULT_NET
    size: str = DEFAULT_SIZE
    ttl_seconds: int = 0
    claim_ref: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    on_expire: str = DESTROY
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> PoolKey:
        return PoolKey.of(self.template, self.net, self.size)

    @classmethod
    def from_json(cls, value: object, path: str = "") -> ClaimRequest:
        body = read_object(value, path)
        refuse_unknown(body, CLAIM_FIELDS, path)
        optional_bool(body.get("no_redirect"), at(path, "no_redirect"))
        return cls(
            template=required_str(body.get("template"), at(path, "template")),
            net=optional_str(body.get("net"), at(path, "net")) or DEFAULT_NET,
            size=optional_str(body.get("size"), at(path, "size")) or DEFAULT_SIZE,
            ttl_seconds=optional_int(body.get("ttl_seconds"), at(path, "ttl_seconds")) or 0,
            claim_ref=optional_str(body.get("claim_ref"), at(path, "claim_ref")),
            metadata=string_map(body.get("metadata"), at(path, "metadata")),
            on_expire=optional_str(body.get("on_expire"), at(path, "on_expire")) or DESTROY,
            env=string_map(body.get("env"), at(path, "env")),
        )

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "template": self.template,
            "net": self.net,
            "size": self.size,
            "ttl_seconds": self.ttl_seconds,
            "claim_ref": self.claim_ref,
            "metadata": dict(self.metadata),
            "on_expire": self.on_expire,
        }
        if self.env:  # only when given: an agent from before claim env refuses the field
            body["env"] = dict(self.env)
        return body


@dataclass(frozen=True, slots=True)
class ClaimGrant:
    """A granted claim: the sandbox's id, its own bearer token, its lease's deadline and
    the address of the agent that holds it. ``sandbox`` is the new sandbox's row (without
    its token), so a caller can show it before the next publish; None from an agent that
    predates it."""

    id: str
    token: str
    deadline: datetime | None = None
    owner_addr: str = ""
    sandbox: SandboxRow | None = None

    @classmethod
    def from_json(cls, value: object, path: str = "") -> ClaimGrant:
        body = read_object(value, path)
        row = body.get("sandbox")
        return cls(
            id=required_str(body.get("id"), at(path, "id")),
            token=required_str(body.get("token"), at(path, "token")),
            deadline=optional_time(body.get("deadline"), at(path, "deadline")),
            owner_addr=optional_str(body.get("owner_addr"), at(path, "owner_addr")),
            sandbox=None if row is None else SandboxRow.from_json(row, at(path, "sandbox")),
        )

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "token": self.token,
            "deadline": time_json(self.deadline),
            "owner_addr": self.owner_addr,
        }
        if self.sandbox is not None:
            body["sandbox"] = self.sandbox.to_json()
        return body


# --- POST /v1/sandboxes/{id}/renew ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RenewRequest:
    """A new lease of ``ttl_seconds`` from now (0: the default); ``on_expire`` None keeps
    the current one."""

    ttl_seconds: int = 0
    on_expire: str | None = None

    @classmethod
    def from_json(cls, value: object, path: str = "") -> RenewRequest:
        body = read_object(value, path)
        refuse_unknown(body, ("ttl_seconds", "on_expire"), path)
        return cls(
            ttl_seconds=optional_int(body.get("ttl_seconds"), at(path, "ttl_seconds")) or 0,
            on_expire=nullable_str(body.get("on_expire"), at(path, "on_expire")),
        )

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"ttl_seconds": self.ttl_seconds}
        if self.on_expire is not None:
            body["on_expire"] = self.on_expire
        return body


@dataclass(frozen=True, slots=True)
class RenewAnswer:
    deadline: datetime | None

    @classmethod
    def from_json(cls, value: object, path: str = "") -> RenewAnswer:
        body = read_object(value, path)
        return cls(optional_time(body.get("deadline"), at(path, "deadline")))

    def to_json(self) -> dict[str, Any]:
        return {"deadline": time_json(self.deadline)}


# --- PUT /v1/pools --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PoolTarget:
    """``warm`` sandboxes to keep ready for one pool key."""

    key: PoolKey
    warm: int

    @classmethod
    def from_json(cls, value: object, path: str = "pool") -> PoolTarget:
        body = read_object(value, path)
        refuse_unknown(body, ("template", "net", "size", "warm"), path)
        return cls(
            key=pool_key(body, path),
            warm=required_int(body.get("warm"), at(path, "warm")),
        )

    def to_json(self) -> dict[str, Any]:
        return {**pool_key_json(self.key), "warm": self.warm}


@dataclass(frozen=True, slots=True)
class PoolsUpdate:
    """Every warm target at once: a pool left out drains to zero."""

    pools: tuple[PoolTarget, ...]

    @classmethod
    def from_json(cls, value: object, path: str = "") -> PoolsUpdate:
        body = read_object(value, path)
        refuse_unknown(body, ("pools",), path)
        where = at(path, "pools")
        pools = required_list(body.get("pools"), where)
        return cls(tuple(PoolTarget.from_json(p, f"{where}[{i}]") for i, p in enumerate(pools)))

    def to_json(self) -> dict[str, Any]:
        return {"pools": [pool.to_json() for pool in self.pools]}

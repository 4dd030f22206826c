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

from sandboxctl.agentapi.errors import AgentAnswerError
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
    required_number,
    required_str,
    string_map,
    time_json,
)
from sandboxctl.agentapi.network import policy_from_json, policy_json
from sandboxctl.core.model import DEFAULT_NET, DEFAULT_SIZE, PoolKey
from sandboxctl.core.netpolicy import NetworkPolicy

DESTROY = "destroy"
CLAIM_FIELDS = frozenset(
    {"template", "net", "size", "ttl_seconds", "claim_ref", "metadata", "on_expire", "env"}
    | {"network"}
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
class TemplateBuild:
    """A served template built from Debian packages (a template store's): its build's
    digest, when it was built, its size on disk, its spec and its start/ready commands."""

    template: str
    digest: str
    created_at: datetime
    size_bytes: int
    suite: str = ""
    packages: tuple[str, ...] = ()
    run: tuple[str, ...] = ()
    build_seconds: float = 0.0
    start_cmd: str = ""
    ready_cmd: str = ""

    @classmethod
    def from_json(cls, value: object, path: str = "template") -> TemplateBuild:
        body = read_object(value, path)
        created = optional_time(body.get("created_at"), f"{path}.created_at")
        if created is None:
            raise AgentAnswerError(f"{path}.created_at", "required")
        return cls(
            template=required_str(body.get("template"), f"{path}.template"),
            digest=required_str(body.get("digest"), f"{path}.digest"),
            created_at=created,
            size_bytes=required_int(body.get("size_bytes"), f"{path}.size_bytes"),
            suite=optional_str(body.get("suite"), f"{path}.suite"),
            packages=_strings(body.get("packages"), f"{path}.packages"),
            run=_strings(body.get("run"), f"{path}.run"),
            build_seconds=required_number(body.get("build_seconds", 0), f"{path}.build_seconds"),
            start_cmd=optional_str(body.get("start_cmd"), f"{path}.start_cmd"),
            ready_cmd=optional_str(body.get("ready_cmd"), f"{path}.ready_cmd"),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "template": self.template,
            "digest": self.digest,
            "created_at": time_json(self.created_at),
            "size_bytes": self.size_bytes,
            "suite": self.suite,
            "packages": list(self.packages),
            "run": list(self.run),
            "build_seconds": self.build_seconds,
            "start_cmd": self.start_cmd,
            "ready_cmd": self.ready_cmd,
        }


def _strings(value: object, path: str) -> tuple[str, ...]:
    return tuple(required_str(v, f"{path}[{i}]") for i, v in enumerate(optional_list(value, path)))


@dataclass(frozen=True, slots=True)
class AgentInfo:
    """What one agent reports about itself. ``advertise_addr`` is where the rest of the
    fleet reaches it; ``limits`` says how size limits are enforced (``cgroup-v1``,
    ``rlimit``); ``templates`` names every template it serves (claims of them start
    cold when no warm sandbox is left)."""

    node: str
    advertise_addr: str = ""
    pools: tuple[PoolStatus, ...] = ()
    claimed: int = 0
    hibernated: int = 0
    capacity: int = 0
    at_capacity: bool = False
    runtime: str = ""
    limits: str = ""
    templates: tuple[str, ...] = ()
    # The served templates built from Debian packages (a subset of ``templates``).
    template_builds: tuple[TemplateBuild, ...] = ()

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
            templates=tuple(
                required_str(name, f"{path}.templates[{i}]")
                for i, name in enumerate(optional_list(body.get("templates"), f"{path}.templates"))
            ),
            template_builds=tuple(
                TemplateBuild.from_json(build, f"{path}.template_builds[{i}]")
                for i, build in enumerate(
                    optional_list(body.get("template_builds"), f"{path}.template_builds")
                )
            ),
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
            "templates": list(self.templates),
            "template_builds": [build.to_json() for build in self.template_builds],
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
    # The sandbox's network policy and address; None from an agent without networks.
    network: NetworkPolicy | None = None
    address: str = ""

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
            network=None
            if body.get("network") is None
            else policy_from_json(body["network"], at(path, "network"), strict=False),
            address=optional_str(body.get("address"), at(path, "address")),
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
        if self.network is not None:
            body["network"] = policy_json(self.network)
            body["address"] = self.address
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
    # None: what ``net`` says (egress: internet, none: no egress), no other rules.
    network: NetworkPolicy | None = None

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
            network=None
            if body.get("network") is None
            else policy_from_json(body["network"], at(path, "network")),
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
        if self.network is not None:  # likewise for an agent from before networks
            body["network"] = policy_json(self.network)
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


# --- GET /v1/sandboxes/{id}/metrics -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UsageSample:
    """One usage reading of a sandbox: at ``timestamp`` (unix seconds), CPU use over the
    interval before it in percent of its ``cpu_count`` CPUs, memory and disk in bytes."""

    timestamp: float
    cpu_count: int
    cpu_used_pct: float
    mem_used: int
    mem_total: int
    mem_cache: int
    disk_used: int
    disk_total: int

    @classmethod
    def from_json(cls, value: object, path: str = "sample") -> UsageSample:
        body = read_object(value, path)
        return cls(
            timestamp=required_number(body.get("timestamp"), at(path, "timestamp")),
            cpu_count=required_int(body.get("cpu_count"), at(path, "cpu_count")),
            cpu_used_pct=required_number(body.get("cpu_used_pct"), at(path, "cpu_used_pct")),
            mem_used=required_int(body.get("mem_used"), at(path, "mem_used")),
            mem_total=required_int(body.get("mem_total"), at(path, "mem_total")),
            mem_cache=required_int(body.get("mem_cache"), at(path, "mem_cache")),
            disk_used=required_int(body.get("disk_used"), at(path, "disk_used")),
            disk_total=required_int(body.get("disk_total"), at(path, "disk_total")),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "timestamp": self.timestamp,
            "cpu_count": self.cpu_count,
            "cpu_used_pct": self.cpu_used_pct,
            "mem_used": self.mem_used,
            "mem_total": self.mem_total,
            "mem_cache": self.mem_cache,
            "disk_used": self.disk_used,
            "disk_total": self.disk_total,
        }


@dataclass(frozen=True, slots=True)
class UsageSamples:
    """The answer to ``GET /v1/sandboxes/{id}/metrics``: ``{"samples": [...]}``, oldest
    first."""

    samples: tuple[UsageSample, ...] = ()

    @classmethod
    def from_json(cls, value: object, path: str = "") -> UsageSamples:
        body = read_object(value, path)
        where = at(path, "samples")
        rows = required_list(body.get("samples"), where)
        return cls(tuple(UsageSample.from_json(r, f"{where}[{i}]") for i, r in enumerate(rows)))

    def to_json(self) -> dict[str, Any]:
        return {"samples": [sample.to_json() for sample in self.samples]}


# --- GET /v1/sandboxes/{id}/logs --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogEvent:
    """One event of a sandbox's log: ``level`` is debug, info, warn or error."""

    timestamp: float
    level: str
    message: str
    fields: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, value: object, path: str = "event") -> LogEvent:
        body = read_object(value, path)
        return cls(
            timestamp=required_number(body.get("timestamp"), at(path, "timestamp")),
            level=required_str(body.get("level"), at(path, "level")),
            message=optional_str(body.get("message"), at(path, "message")),
            fields=string_map(body.get("fields"), at(path, "fields")),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "timestamp": self.timestamp,
            "level": self.level,
            "message": self.message,
            "fields": dict(self.fields),
        }


@dataclass(frozen=True, slots=True)
class SandboxLog:
    """The answer to ``GET /v1/sandboxes/{id}/logs``: whose sandbox it is (``claim_ref``)
    and its events, oldest first. Answered for a destroyed sandbox too, while the agent
    keeps its log."""

    claim_ref: str
    events: tuple[LogEvent, ...] = ()

    @classmethod
    def from_json(cls, value: object, path: str = "") -> SandboxLog:
        body = read_object(value, path)
        where = at(path, "events")
        rows = required_list(body.get("events"), where)
        return cls(
            claim_ref=optional_str(body.get("claim_ref"), at(path, "claim_ref")),
            events=tuple(LogEvent.from_json(r, f"{where}[{i}]") for i, r in enumerate(rows)),
        )

    def to_json(self) -> dict[str, Any]:
        return {"claim_ref": self.claim_ref, "events": [event.to_json() for event in self.events]}

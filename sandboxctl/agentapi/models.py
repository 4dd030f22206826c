"""The agent API's JSON shapes, one msgspec Struct each, written once for both ends.

The agent answers with these and reads its request bodies into them; the client reads
the answers into them and sends the requests. ``from_json`` raises
:class:`~sandboxctl.core.wire.WireError` naming the first field that does not fit (the
client turns it into :class:`AgentAnswerError`, the agent into a 400); written by
:func:`sandboxctl.core.wire.encode`, each gives the exact JSON the agent has always
served (same fields, same order), so existing clients see no change.

Answers are read leniently, for agents older or newer than this one: an unknown field is
ignored and a missing optional one takes its default. Request bodies are read strictly
(an unknown field is an error), since a misspelt option must not pass as its default.
Times are aware datetimes, written in UTC at second precision with ``Z``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import msgspec
from msgspec import UNSET, UnsetType

from sandboxctl.core.model import DEFAULT_NET, DEFAULT_SIZE, PoolKey
from sandboxctl.core.netpolicy import NetworkPolicy
from sandboxctl.core.timestamps import ZonedTime
from sandboxctl.core.wire import Count, Model, NonEmpty

DESTROY = "destroy"
Number = Annotated[float, msgspec.Meta(ge=0)]  # a number from 0 up, whole or not


class Request(Model, frozen=True, forbid_unknown_fields=True):
    """A request body: read strictly."""


# --- GET /v1/info (and the answer to PUT /v1/pools) ----------------------------------------


class PoolStatus(Model, frozen=True):
    """One warm pool: sandboxes ready now, the target, and starts in progress."""

    ROOT = "pool"

    key: PoolKey
    warm: Count
    target: Count
    refilling: Count = 0


class TemplateBuild(Model, frozen=True):
    """A served template built from Debian packages (a template store's): its build's
    digest, when it was built, its size on disk, its spec and its start/ready commands."""

    ROOT = "template"

    template: NonEmpty
    digest: NonEmpty
    created_at: ZonedTime
    size_bytes: Count
    suite: str = ""
    packages: tuple[NonEmpty, ...] = ()
    run: tuple[NonEmpty, ...] = ()
    build_seconds: Number = 0.0
    start_cmd: str = ""
    ready_cmd: str = ""


class AgentInfo(Model, frozen=True):
    """What one agent reports about itself. ``advertise_addr`` is where the rest of the
    fleet reaches it; ``limits`` says how size limits are enforced (``cgroup-v1``,
    ``rlimit``); ``templates`` names every template it serves (claims of them start
    cold when no warm sandbox is left)."""

    ROOT = "info"

    node: NonEmpty
    advertise_addr: str = ""
    pools: tuple[PoolStatus, ...] = ()
    claimed: Count = 0
    hibernated: Count = 0
    capacity: Count = 0
    at_capacity: bool = False
    runtime: str = ""
    limits: str = ""
    templates: tuple[NonEmpty, ...] = ()
    # The served templates built from Debian packages (a subset of ``templates``).
    template_builds: tuple[TemplateBuild, ...] = ()


# --- GET /v1/sandboxes and GET /v1/sandboxes/{id} -------------------------------------------


class SandboxRow(Model, frozen=True):
    """One claimed sandbox. ``token`` is only in the by-id answer; a claim's ``env`` is in
    no answer at all (its values may be secrets). ``archived`` is an upstream agent's
    paused-to-disk flag, read as hibernated; this agent never sets it. A time an upstream
    agent writes as Go's zero time reads as none (``agentapi.mapping``)."""

    id: NonEmpty
    key: PoolKey
    deadline: ZonedTime | None = None
    claimed_at: ZonedTime | None = None
    hibernated: bool = False
    claim_ref: str = ""
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    cpu_count: Count | None = None
    mem_total_bytes: Count | None = None
    token: str | UnsetType = UNSET
    archived: bool | UnsetType = UNSET
    # The sandbox's network policy and address; left out by an agent without networks.
    network: NetworkPolicy | UnsetType = UNSET
    address: str | UnsetType = UNSET


class SandboxList(Model, frozen=True):
    """The answer to ``GET /v1/sandboxes``: ``{"sandboxes": [row, ...]}``."""

    sandboxes: tuple[SandboxRow, ...]


# --- POST /v1/claim -------------------------------------------------------------------------


class ClaimedPolicy(NetworkPolicy, frozen=True, forbid_unknown_fields=True):
    """A claim's network policy: part of a request, so read strictly."""

    @classmethod
    def of(cls, policy: NetworkPolicy) -> ClaimedPolicy:
        return cls(policy.internet, policy.allow_out, policy.deny_out, policy.public_traffic)


class ClaimRequest(Request, frozen=True):
    """A claim of one sandbox of the pool key (``template``, ``net``, ``size``).

    ``ttl_seconds`` 0 means the agent's default lease; ``claim_ref`` is empty or
    ``<namespace>/<name>``; ``env`` is set by envd for every command in the sandbox and
    never listed (its values may be secrets); ``network`` None is what ``net`` says
    (egress: internet, none: no egress), no other rules. ``no_redirect`` is accepted from
    upstream clients and ignored: this agent never redirects."""

    template: NonEmpty
    net: str = DEFAULT_NET
    size: str = DEFAULT_SIZE
    ttl_seconds: Count = 0
    claim_ref: str = ""
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    on_expire: str = DESTROY
    # Written only when given: an agent from before them refuses the fields.
    env: dict[str, str] | UnsetType = UNSET
    network: ClaimedPolicy | UnsetType = UNSET
    no_redirect: bool | UnsetType = UNSET

    def __post_init__(self) -> None:
        for name, default in (("net", DEFAULT_NET), ("size", DEFAULT_SIZE), ("on_expire", DESTROY)):
            if not getattr(self, name):
                msgspec.structs.force_setattr(self, name, default)
        if self.env == {}:
            msgspec.structs.force_setattr(self, "env", UNSET)
        msgspec.structs.force_setattr(self, "no_redirect", UNSET)  # checked, then dropped

    @property
    def key(self) -> PoolKey:
        return PoolKey.of(self.template, self.net, self.size)


class ClaimGrant(Model, frozen=True):
    """A granted claim: the sandbox's id, its own bearer token, its lease's deadline and
    the address of the agent that holds it. ``sandbox`` is the new sandbox's row (without
    its token), so a caller can show it before the next publish; left out by an agent
    that predates it."""

    id: NonEmpty
    token: NonEmpty
    deadline: ZonedTime | None = None
    owner_addr: str = ""
    sandbox: SandboxRow | UnsetType = UNSET


# --- POST /v1/sandboxes/{id}/renew ----------------------------------------------------------


class RenewRequest(Request, frozen=True):
    """A new lease of ``ttl_seconds`` from now (0: the default); ``on_expire`` None keeps
    the current one."""

    ttl_seconds: Count = 0
    on_expire: str | UnsetType = UNSET


class RenewAnswer(Model, frozen=True):
    deadline: ZonedTime | None = None


# --- PUT /v1/pools --------------------------------------------------------------------------


class PoolTarget(Request, frozen=True, kw_only=True):
    """``warm`` sandboxes to keep ready for one pool key (the key's fields, flat)."""

    ROOT = "pool"

    template: NonEmpty
    net: str = ""
    size: str = ""
    warm: Count

    @classmethod
    def of(cls, key: PoolKey, warm: int) -> PoolTarget:
        return cls(template=key.template, net=key.net, size=key.size, warm=warm)

    @property
    def key(self) -> PoolKey:
        return PoolKey.of(self.template, self.net, self.size)


class PoolsUpdate(Request, frozen=True):
    """Every warm target at once: a pool left out drains to zero."""

    pools: tuple[PoolTarget, ...]


# --- GET /v1/sandboxes/{id}/metrics -----------------------------------------------------------


class UsageSample(Model, frozen=True):
    """One usage reading of a sandbox: at ``timestamp`` (unix seconds), CPU use over the
    interval before it in percent of its ``cpu_count`` CPUs, memory and disk in bytes."""

    ROOT = "sample"

    timestamp: Number
    cpu_count: Count
    cpu_used_pct: Number
    mem_used: Count
    mem_total: Count
    mem_cache: Count
    disk_used: Count
    disk_total: Count


class UsageSamples(Model, frozen=True):
    """The answer to ``GET /v1/sandboxes/{id}/metrics``: ``{"samples": [...]}``, oldest
    first."""

    samples: tuple[UsageSample, ...]


# --- GET /v1/sandboxes/{id}/logs --------------------------------------------------------------


class LogEvent(Model, frozen=True):
    """One event of a sandbox's log: ``level`` is debug, info, warn or error."""

    ROOT = "event"

    timestamp: Number
    level: NonEmpty
    message: str = ""
    fields: dict[str, str] = msgspec.field(default_factory=dict)


class SandboxLog(Model, frozen=True, kw_only=True):
    """The answer to ``GET /v1/sandboxes/{id}/logs``: whose sandbox it is (``claim_ref``)
    and its events, oldest first. Answered for a destroyed sandbox too, while the agent
    keeps its log."""

    claim_ref: str = ""
    events: tuple[LogEvent, ...]


def time_of(value: datetime | None) -> datetime | None:
    """A time read from an agent: none for Go's zero time (year 1), which upstream agents
    write for a time they do not have."""
    return None if value is None or value.year == 1 else value

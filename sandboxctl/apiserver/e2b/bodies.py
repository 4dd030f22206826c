"""The request bodies of the e2b API, as the unmodified SDKs send them.

A create (``NewSandbox``) and a network update are read strictly: a field this server
does not know is a 400 naming it (docs/e2b-compat.md: better refused than dropped), and
so is an option it cannot honour. The verbs' bodies (connect, timeout, refresh, pause,
resume) are read as upstream reads them, ignoring what they do not name: the SDKs add
fields to them over time (``requireHealthyGuest`` on pause predates e2b's own spec).
Attribute names are e2b's JSON names.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import msgspec

from sandboxctl.core.envvars import check_env
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.netpolicy import NetworkPolicy, targets
from sandboxctl.core.wire import Model, NonEmpty

MAX_TIMEOUT: Final = 24 * 3600  # what a host agent grants at most
MAX_REFRESH: Final = 3600
Seconds = Annotated[int, msgspec.Meta(ge=1, le=MAX_TIMEOUT)]
EMPTY: Final[tuple[object, ...]] = (None, [], {})  # an option given this way is not asked for

# What this fleet does not serve, and why: refused when given with a value.
NOT_SERVED: Final = {
    "egressProxy": "egress through a SOCKS5 proxy is not served",
    "rules": "per-domain transform rules are not served",
    "maskRequestHost": "host masking is not served",
    "httpsPorts": "guest ports are relayed as plain HTTP",
}
UNSUPPORTED: Final = {
    "mcp": "MCP gateways are not served",
    "iam": "workload identity is not served",
    "volumeMounts": "volumes are not served",
}


class _Network(Model, frozen=True, forbid_unknown_fields=True):
    """What a create's ``network`` and a network update share. ``dnsServers`` is
    upstream's resolver list: this fleet refuses domain names in ``allowOut``, where it
    takes effect, so it is checked and otherwise has no effect (as upstream's with no
    domain in ``allowOut``)."""

    allowOut: tuple[str, ...] = ()
    denyOut: tuple[str, ...] = ()
    dnsServers: tuple[str, ...] = ()
    egressProxy: Any = None
    rules: Any = None
    maskRequestHost: Any = None
    httpsPorts: Any = None

    def __post_init__(self) -> None:
        for name, why in NOT_SERVED.items():
            if getattr(self, name) not in EMPTY:
                raise InvalidValueError(f"{name}: not supported: {why}")
        for server in self.dnsServers:
            if "/" in server or targets([server], "dnsServers")[0] != f"{server}/32":
                raise InvalidValueError(f"dnsServers: {server!r} is not an IPv4")


class NetworkConfig(_Network, frozen=True):
    """A create's ``network``."""

    allowPublicTraffic: bool = True

    def policy(self, internet: bool) -> NetworkPolicy:
        return NetworkPolicy(internet, self.allowOut, self.denyOut, self.allowPublicTraffic)


class NetworkUpdate(_Network, frozen=True):
    """``PUT /sandboxes/{id}/network``: it replaces the egress rules (an omitted list
    clears them); ``allow_internet_access`` omitted keeps the current setting."""

    allow_internet_access: bool | None = None


class AutoResume(Model, frozen=True):
    enabled: bool = False


class NewSandbox(Model, frozen=True, forbid_unknown_fields=True):
    """``POST /sandboxes`` and ``/v2/sandboxes``. ``envVars`` are stored with the claim
    by the owning agent and set by envd for every command; never listed, since values may
    be secrets. They are checked here, so a bad name is a 400 even when no node has room."""

    templateID: NonEmpty
    timeout: Seconds | None = None
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    envVars: dict[str, str] = msgspec.field(default_factory=dict)
    autoPause: bool = False
    autoPauseMemory: bool = True
    autoResume: AutoResume | None = None
    allow_internet_access: bool = False
    secure: bool = True
    network: NetworkConfig | None = None
    mcp: Any = None
    iam: Any = None
    volumeMounts: Any = None

    def __post_init__(self) -> None:
        check_env(self.envVars, "envVars")
        _refuse_unserved(self)
        if self.autoPause and self.allow_internet_access:
            raise InvalidValueError(
                "autoPause with allow_internet_access: not supported: egress sandboxes "
                "cannot be paused on expiry"
            )

    def policy(self) -> NetworkPolicy:
        """The new sandbox's network policy (its targets checked: a 400 naming them)."""
        internet = self.allow_internet_access
        return (self.network or NetworkConfig()).policy(internet)


def _refuse_unserved(body: NewSandbox) -> None:
    if not body.secure:
        raise InvalidValueError(
            "secure: false is not supported: every sandbox gets an access token"
        )
    for option, why in UNSUPPORTED.items():
        if getattr(body, option) not in EMPTY:
            raise InvalidValueError(f"{option}: not supported: {why}")
    if not body.autoPauseMemory:
        raise InvalidValueError("autoPauseMemory: false is not supported: a pause keeps memory")
    if body.autoResume is not None and body.autoResume.enabled:
        raise InvalidValueError("autoResume.enabled: not supported: resume with connect")


class ConnectBody(Model, frozen=True):
    """``POST /sandboxes/{id}/connect`` (and v2): the lease to extend to."""

    timeout: Seconds | None = None
    memory: bool = True


class TimeoutBody(Model, frozen=True):
    """``POST /sandboxes/{id}/timeout``: the new lease, which may shorten it."""

    timeout: Seconds


class RefreshBody(Model, frozen=True):
    """``POST /sandboxes/{id}/refreshes``: ``duration`` 0 is the default timeout."""

    duration: Annotated[int, msgspec.Meta(ge=0, le=MAX_REFRESH)] = 0


class PauseBody(Model, frozen=True):
    memory: bool = True
    requireHealthyGuest: bool = False


class ResumeBody(Model, frozen=True):
    """Legacy resume: ``timeout`` renews the lease when given."""

    timeout: Seconds | None = None
    autoPause: bool = False

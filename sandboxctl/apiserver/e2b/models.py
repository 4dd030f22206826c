"""The JSON bodies the e2b SDK parses: ``Sandbox`` (create, connect, resume) and
``ListedSandbox`` / ``SandboxDetail`` (list, get). Every field the SDK requires is always
present (see docs/e2b-compat.md); attribute names are e2b's JSON names, in its order."""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime, timedelta
from typing import Any

from msgspec import UNSET, UnsetType

from sandboxctl.apiserver.e2b.config import E2bConfig
from sandboxctl.apiserver.e2b.paging import state_of
from sandboxctl.core.ids import SandboxId, public_id
from sandboxctl.core.netpolicy import NetworkPolicy
from sandboxctl.core.snapshot import Located
from sandboxctl.core.wire import Model, whole_seconds


def envd_access_token(secret: bytes, claim_token: str) -> str:
    """Lowercase hex HMAC-SHA256 of the claim token, keyed by the envd secret: what the
    SDK sends envd as X-Access-Token. The claim token itself never leaves the server."""
    return hmac.new(secret, claim_token.encode(), hashlib.sha256).hexdigest()


def traffic_access_token(secret: bytes, claim_token: str) -> str:
    """What guest ports of a sandbox with private traffic require as
    ``E2B-Traffic-Access-Token``: like the envd token, but never equal to it."""
    return hmac.new(secret, b"traffic:" + claim_token.encode(), hashlib.sha256).hexdigest()


class Sandbox(Model, frozen=True, kw_only=True):
    """The ``Sandbox`` model (create, connect, resume); ``trafficAccessToken`` is null
    unless the sandbox was created with ``allowPublicTraffic`` false."""

    templateID: str
    sandboxID: str
    clientID: str
    envdVersion: str
    envdAccessToken: str
    trafficAccessToken: str | None
    domain: str
    alias: str | UnsetType = UNSET


class ListedSandbox(Model, frozen=True, kw_only=True):
    """The ``ListedSandbox`` model; ``SandboxDetail`` adds to it."""

    templateID: str
    sandboxID: str
    clientID: str
    startedAt: datetime
    endAt: datetime
    cpuCount: int
    memoryMB: int
    diskSizeMB: int
    state: str
    envdVersion: str
    metadata: dict[str, str]
    alias: str | UnsetType = UNSET


class NetworkBody(Model, frozen=True):
    """The ``network`` of a ``SandboxDetail``."""

    allowOut: tuple[str, ...]
    denyOut: tuple[str, ...]
    allowPublicTraffic: bool

    @classmethod
    def of(cls, policy: NetworkPolicy) -> NetworkBody:
        return cls(policy.allow_out, policy.deny_out, policy.public_traffic)


class SandboxDetail(ListedSandbox, frozen=True, kw_only=True):
    domain: str
    envdAccessToken: str | UnsetType = UNSET
    allowInternetAccess: bool | UnsetType = UNSET
    network: NetworkBody | UnsetType = UNSET


def alias_of(config: E2bConfig, template: str, requested: str | None = None) -> str | None:
    """The alias a sandbox was asked for, else the first alias naming its template."""
    if requested is not None and requested in config.aliases:
        return requested
    for alias, (target, _) in config.aliases.items():
        if target == template:
            return alias
    return None


def sandbox_body(
    config: E2bConfig,
    *,
    claim_id: str,
    node: str,
    template: str,
    claim_token: str,
    requested: str | None = None,
    private: bool = False,
) -> Sandbox:
    """The ``Sandbox`` of a claim. ``private``: a sandbox created with
    ``allowPublicTraffic`` false, whose guest ports need its traffic access token."""
    alias = alias_of(config, template, requested)
    return Sandbox(
        templateID=template,
        sandboxID=SandboxId.of_claim(claim_id).public,
        clientID=node,
        envdVersion=config.envd_version,
        envdAccessToken=envd_access_token(config.envd_secret, claim_token),
        trafficAccessToken=(
            traffic_access_token(config.envd_secret, claim_token) if private else None
        ),
        domain=config.domain,
        alias=UNSET if alias is None else alias,
    )


def listed_body(config: E2bConfig, located: Located, now: datetime) -> ListedSandbox:
    return ListedSandbox(**_listed(config, located, now))


def detail_body(
    config: E2bConfig,
    located: Located,
    now: datetime,
    claim_token: str,
    network: NetworkPolicy | None = None,
) -> SandboxDetail:
    """The ``SandboxDetail``, with the envd token of a claim token and the policy of a
    sandbox with a network."""
    extra: dict[str, Any] = {}
    if claim_token:
        extra["envdAccessToken"] = envd_access_token(config.envd_secret, claim_token)
    if network is not None:
        extra.update(allowInternetAccess=network.internet, network=NetworkBody.of(network))
    return SandboxDetail(**_listed(config, located, now), domain=config.domain, **extra)


def _listed(config: E2bConfig, located: Located, now: datetime) -> dict[str, Any]:
    entry = located.entry
    started = entry.claimed_at or now
    ends = entry.deadline or started + timedelta(seconds=config.default_timeout)
    alias = alias_of(config, entry.template)
    return {  # times as they are written, so a list can be written by wire.encode_listing
        "templateID": entry.template,
        "sandboxID": public_id(entry.id),
        "clientID": located.node,
        "startedAt": whole_seconds(started),
        "endAt": whole_seconds(ends),
        "cpuCount": entry.cpu_count or 0,
        "memoryMB": (entry.memory_bytes or 0) >> 20,
        "diskSizeMB": 0,
        "state": state_of(entry),
        "envdVersion": config.envd_version,
        "metadata": dict(entry.metadata),
        "alias": UNSET if alias is None else alias,
    }

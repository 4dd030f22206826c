"""The JSON bodies the e2b SDK parses: ``Sandbox`` (create, connect, resume) and
``ListedSandbox`` / ``SandboxDetail`` (list, get). Every field the SDK requires is always
present (see docs/e2b-compat.md)."""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime, timedelta
from typing import Any

from sandboxctl.apiserver.e2b.config import E2bConfig
from sandboxctl.apiserver.e2b.ids import public_id
from sandboxctl.apiserver.e2b.paging import metadata_of, state_of
from sandboxctl.core.snapshot import Located


def envd_access_token(secret: bytes, claim_token: str) -> str:
    """Lowercase hex HMAC-SHA256 of the claim token, keyed by the envd secret: what the
    SDK sends envd as X-Access-Token. The claim token itself never leaves the server."""
    return hmac.new(secret, claim_token.encode(), hashlib.sha256).hexdigest()


def traffic_access_token(secret: bytes, claim_token: str) -> str:
    """What guest ports of a sandbox with private traffic require as
    ``E2B-Traffic-Access-Token``: like the envd token, but never equal to it."""
    return hmac.new(secret, b"traffic:" + claim_token.encode(), hashlib.sha256).hexdigest()


def iso(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


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
) -> dict[str, Any]:
    """The ``Sandbox`` model (create, connect, resume). ``private``: a sandbox created
    with ``allowPublicTraffic`` false, whose guest ports need its traffic access token."""
    body: dict[str, Any] = {
        "templateID": template,
        "sandboxID": public_id(claim_id),
        "clientID": node,
        "envdVersion": config.envd_version,
        "envdAccessToken": envd_access_token(config.envd_secret, claim_token),
        "trafficAccessToken": (
            traffic_access_token(config.envd_secret, claim_token) if private else None
        ),
        "domain": config.domain,
    }
    alias = alias_of(config, template, requested)
    if alias is not None:
        body["alias"] = alias
    return body


def listed_body(config: E2bConfig, located: Located, now: datetime) -> dict[str, Any]:
    """The ``ListedSandbox`` model; ``SandboxDetail`` adds to it."""
    entry = located.entry
    started = entry.claimed_at or now
    end = entry.deadline or started + timedelta(seconds=config.default_timeout)
    body: dict[str, Any] = {
        "templateID": entry.template,
        "sandboxID": public_id(entry.id),
        "clientID": located.node,
        "startedAt": iso(started),
        "endAt": iso(end),
        "cpuCount": entry.cpu_count or 0,
        "memoryMB": (entry.memory_bytes or 0) >> 20,
        "diskSizeMB": 0,
        "state": state_of(entry),
        "envdVersion": config.envd_version,
        "metadata": metadata_of(entry),
    }
    alias = alias_of(config, entry.template)
    if alias is not None:
        body["alias"] = alias
    return body


def detail_body(
    config: E2bConfig, located: Located, now: datetime, claim_token: str | None
) -> dict[str, Any]:
    body = listed_body(config, located, now)
    body["domain"] = config.domain
    if claim_token:
        body["envdAccessToken"] = envd_access_token(config.envd_secret, claim_token)
    return body

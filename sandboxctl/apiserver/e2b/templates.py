"""e2b's template bodies for the templates the fleet serves: ``Template`` (list),
``TemplateWithBuilds`` (one template) and ``TemplateAliasResponse``.

A template is served when a fresh node lists it or has a pool of it; its aliases are the
alias table's entries that point at it, and its own name. Every template is one build,
``ready``; the fleet keeps no history of builds or spawns, so those figures are 0. A
template built from Debian packages (``sandboxctl template build``) has its build's id
(from its digest) and time, and a ``sandboxctl`` object with the rest of its build: its
digest, suite, packages, run commands, size on disk, build time, start and ready
commands. The host root (``base``) and ``--template`` directories have a build id
derived from their name and the time of the answer.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from msgspec import UNSET, UnsetType

from sandboxctl.apiserver.e2b.config import E2bConfig
from sandboxctl.core.templates import build_id as digest_build_id
from sandboxctl.core.timestamps import format_rfc3339
from sandboxctl.core.wire import Model
from sandboxctl.sandboxd.runtime import SIZE_LIMITS, Size


class BuildInfo(Model, frozen=True, kw_only=True):
    """``sandboxctl``: what a node lists of a template's build (``agentapi.mapping``)."""

    digest: Any
    createdAt: Any
    sizeBytes: Any
    buildSeconds: Any
    suite: Any
    packages: Any
    run: Any
    startCmd: str
    readyCmd: str


class Template(Model, frozen=True, kw_only=True):
    """The ``Template`` model of one served template (size small)."""

    templateID: str
    buildID: str
    cpuCount: int
    memoryMB: int
    diskSizeMB: int
    public: bool = True
    aliases: list[str]
    names: list[str]
    createdAt: str
    updatedAt: str
    createdBy: None = None
    lastSpawnedAt: None = None
    spawnCount: int = 0
    buildCount: int = 1
    envdVersion: str
    buildStatus: str = "ready"
    sandboxctl: BuildInfo | UnsetType = UNSET


class TemplateBuild(Model, frozen=True, kw_only=True):
    buildID: str
    status: str = "ready"
    createdAt: str
    updatedAt: str
    finishedAt: str
    cpuCount: int
    memoryMB: int
    diskSizeMB: int
    envdVersion: str


class TemplateWithBuilds(Model, frozen=True, kw_only=True):
    """The ``TemplateWithBuilds`` model: the template and its one build."""

    templateID: str
    public: bool
    aliases: list[str]
    names: list[str]
    createdAt: str
    updatedAt: str
    lastSpawnedAt: None = None
    spawnCount: int = 0
    builds: tuple[TemplateBuild, ...]
    sandboxctl: BuildInfo | UnsetType = UNSET


class TemplateAlias(Model, frozen=True):
    """``TemplateAliasResponse``."""

    templateID: str
    public: bool = True


def aliases_of(config: E2bConfig, template: str) -> list[str]:
    return [alias for alias, (target, _) in config.aliases.items() if target == template]


def build_id(template: str) -> str:
    """A stable build id per template name (e2b's are UUIDs)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"sandboxctl-template:{template}"))


def template_body(
    config: E2bConfig, template: str, now: datetime, entry: Mapping[str, Any] | None = None
) -> Template:
    """The ``Template`` of one served template; ``entry`` is what the node that serves
    it lists of it (its build, when it has one)."""
    limits = SIZE_LIMITS[Size.SMALL]
    aliases = aliases_of(config, template)
    built = _built(entry)
    created = str(built.createdAt) if built else format_rfc3339(now)
    return Template(
        templateID=template,
        buildID=digest_build_id(str(built.digest)) if built else build_id(template),
        cpuCount=limits.cpu_count,
        memoryMB=limits.memory_bytes >> 20,
        diskSizeMB=limits.home_bytes >> 20,
        aliases=aliases,
        names=[template, *(a for a in aliases if a != template)],
        createdAt=created,
        updatedAt=created,
        envdVersion=config.envd_version,
        sandboxctl=built or UNSET,
    )


def _built(entry: Mapping[str, Any] | None) -> BuildInfo | None:
    """What a node lists of a template's build (see ``agentapi.mapping``), or None."""
    if not entry or not entry.get("digest") or not entry.get("createdAt"):
        return None
    keys = ("digest", "createdAt", "sizeBytes", "buildSeconds", "suite", "packages", "run")
    return BuildInfo(
        **{key: entry.get(key) for key in keys},
        startCmd=entry.get("startCmd") or "",
        readyCmd=entry.get("readyCmd") or "",
    )


def with_builds_body(
    config: E2bConfig, template: str, now: datetime, entry: Mapping[str, Any] | None = None
) -> TemplateWithBuilds:
    """The ``TemplateWithBuilds`` of one served template."""
    body = template_body(config, template, now, entry)
    build = TemplateBuild(
        buildID=body.buildID,
        createdAt=body.createdAt,
        updatedAt=body.updatedAt,
        finishedAt=body.updatedAt,
        cpuCount=body.cpuCount,
        memoryMB=body.memoryMB,
        diskSizeMB=body.diskSizeMB,
        envdVersion=body.envdVersion,
    )
    return TemplateWithBuilds(
        templateID=body.templateID,
        public=body.public,
        aliases=body.aliases,
        names=body.names,
        createdAt=body.createdAt,
        updatedAt=body.updatedAt,
        builds=(build,),
        sandboxctl=body.sandboxctl,
    )

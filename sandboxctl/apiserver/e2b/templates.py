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

from sandboxctl.apiserver.e2b.config import E2bConfig
from sandboxctl.apiserver.e2b.models import iso
from sandboxctl.core.templates import build_id as digest_build_id
from sandboxctl.sandboxd.runtime import SIZE_LIMITS, Size


def aliases_of(config: E2bConfig, template: str) -> list[str]:
    return [alias for alias, (target, _) in config.aliases.items() if target == template]


def build_id(template: str) -> str:
    """A stable build id per template name (e2b's are UUIDs)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"sandboxctl-template:{template}"))


def template_body(
    config: E2bConfig, template: str, now: datetime, entry: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The ``Template`` model of one served template (size small); ``entry`` is what the
    node that serves it lists of it (its build, when it has one)."""
    limits = SIZE_LIMITS[Size.SMALL]
    aliases = aliases_of(config, template)
    built = _built(entry)
    created = str(built["createdAt"]) if built else iso(now)
    body = {
        "templateID": template,
        "buildID": digest_build_id(str(built["digest"])) if built else build_id(template),
        "cpuCount": limits.cpu_count,
        "memoryMB": limits.memory_bytes >> 20,
        "diskSizeMB": limits.home_bytes >> 20,
        "public": True,
        "aliases": aliases,
        "names": [template, *(a for a in aliases if a != template)],
        "createdAt": created,
        "updatedAt": created,
        "createdBy": None,
        "lastSpawnedAt": None,
        "spawnCount": 0,
        "buildCount": 1,
        "envdVersion": config.envd_version,
        "buildStatus": "ready",
    }
    if built:
        body["sandboxctl"] = built
    return body


def _built(entry: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What a node lists of a template's build (see ``agentapi.mapping``), or None."""
    if not entry or not entry.get("digest") or not entry.get("createdAt"):
        return None
    keys = ("digest", "createdAt", "sizeBytes", "buildSeconds", "suite", "packages", "run")
    return {
        **{key: entry.get(key) for key in keys},
        "startCmd": entry.get("startCmd") or "",
        "readyCmd": entry.get("readyCmd") or "",
    }


def with_builds_body(
    config: E2bConfig, template: str, now: datetime, entry: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The ``TemplateWithBuilds`` model: the template and its one build."""
    body = template_body(config, template, now, entry)
    build = {
        "buildID": body["buildID"],
        "status": "ready",
        "createdAt": body["createdAt"],
        "updatedAt": body["updatedAt"],
        "finishedAt": body["updatedAt"],
        "cpuCount": body["cpuCount"],
        "memoryMB": body["memoryMB"],
        "diskSizeMB": body["diskSizeMB"],
        "envdVersion": body["envdVersion"],
    }
    keep = ("templateID", "public", "aliases", "names", "createdAt", "updatedAt")
    return {
        **{k: body[k] for k in keep},
        "lastSpawnedAt": None,
        "spawnCount": 0,
        "builds": [build],
        **({"sandboxctl": body["sandboxctl"]} if "sandboxctl" in body else {}),
    }

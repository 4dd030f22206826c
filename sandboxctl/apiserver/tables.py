"""The ``Table`` form kubectl asks for, so ``kubectl get`` prints Sandbox columns.

kubectl sends ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io, ...,
application/json``; a list, a get and each watch event are then answered as a
``meta.k8s.io/v1`` Table whose rows carry the object's metadata as a
``PartialObjectMetadata`` (``-A`` and ``--show-labels`` read it from there). Columns:
Name, ID (the SDK's ``sb-...``), Node, Phase, Template, Age; ``-o wide`` adds Expires In,
IP, CPUs and Memory (priority 1 columns, which kubectl shows only there).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, Final

from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.sandboxes import (
    ANNOTATION_CLAIM_ID,
    ANNOTATION_CPU_COUNT,
    ANNOTATION_DEADLINE,
    ANNOTATION_MEMORY_BYTES,
    CONDITION_READY,
    LABEL_PHASE,
    LABEL_TEMPLATE,
)
from sandboxctl.core.timestamps import parse_rfc3339

TABLE_API_VERSION: Final = "meta.k8s.io/v1"

WIDE: Final = 1  # the priority of the columns kubectl prints only under -o wide
COLUMNS: Final = (
    ("Name", "string", "name", "Name of the sandbox.", 0),
    ("ID", "string", "", "The sandbox's id as the e2b SDK spells it (sandbox_id).", 0),
    ("Node", "string", "", "The node that holds the sandbox.", 0),
    ("Phase", "string", "", "The phase the node reports (Running, Hibernated, ...).", 0),
    ("Template", "string", "", "The template the sandbox was claimed from.", 0),
    ("Age", "string", "", "Time since the sandbox was claimed.", 0),
    ("Expires In", "string", "", "Time left until the sandbox's lease ends.", WIDE),
    ("IP", "string", "", "The sandbox's address on its node.", WIDE),
    ("CPUs", "string", "", "The CPUs the sandbox may use.", WIDE),
    ("Memory", "string", "", "The memory the sandbox may use.", WIDE),
)
NONE: Final = "<none>"  # kubectl's cell for a value that is not set


def wants_table(accept: str) -> bool:
    """Whether the Accept header asks for ``as=Table;g=meta.k8s.io;v=v1``."""
    for media_range in accept.split(","):
        params = {}
        for part in media_range.split(";")[1:]:
            key, _, value = part.strip().partition("=")
            params[key.strip().lower()] = value.strip()
        if (
            params.get("as") == "Table"
            and params.get("g") == "meta.k8s.io"
            and params.get("v") == "v1"
        ):
            return True
    return False


def column_definitions() -> list[dict[str, Any]]:
    return [
        {"name": name, "type": kind, "format": fmt, "description": text, "priority": priority}
        for name, kind, fmt, text, priority in COLUMNS
    ]


def table(
    objects: Iterable[dict[str, Any]], now: datetime, resource_version: str | None = None
) -> dict[str, Any]:
    """A Table of Sandbox objects; ``resource_version`` is the list's, if any."""
    metadata = {"resourceVersion": resource_version} if resource_version is not None else {}
    return {
        "kind": "Table",
        "apiVersion": TABLE_API_VERSION,
        "metadata": metadata,
        "columnDefinitions": column_definitions(),
        "rows": [row(obj, now) for obj in objects],
    }


def row(obj: dict[str, Any], now: datetime) -> dict[str, Any]:
    metadata = obj.get("metadata") or {}
    status = obj.get("status") or {}
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    addresses = status.get("podIPs") or [{}]
    return {
        "cells": [
            metadata.get("name", ""),
            annotations.get(ANNOTATION_CLAIM_ID) or NONE,
            status.get("nodeName", ""),
            labels.get(LABEL_PHASE) or _ready_reason(status),
            labels.get(LABEL_TEMPLATE, ""),
            age(metadata.get("creationTimestamp"), now),
            expires_in(annotations.get(ANNOTATION_DEADLINE), now),
            addresses[0].get("ip") or NONE,
            annotations.get(ANNOTATION_CPU_COUNT) or NONE,
            memory(annotations.get(ANNOTATION_MEMORY_BYTES)),
        ],
        "object": {
            "kind": "PartialObjectMetadata",
            "apiVersion": TABLE_API_VERSION,
            "metadata": metadata,
        },
    }


def expires_in(deadline: object, now: datetime) -> str:
    """The time left until ``deadline`` as kubectl writes an age; ``expired`` once past,
    ``<none>`` when the sandbox has no deadline."""
    if not isinstance(deadline, str) or not deadline:
        return NONE
    try:
        left = parse_rfc3339(deadline) - now
    except InvalidValueError:
        return NONE
    return human_duration(left) if left.total_seconds() >= 0 else "expired"


def memory(text: object) -> str:
    """A byte count as kubectl writes a quantity: ``2Gi``, ``512Mi``, else bytes."""
    if not isinstance(text, str) or not text.isdigit():
        return NONE
    amount = int(text)
    for suffix, shift in (("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if amount and amount % (1 << shift) == 0:
            return f"{amount >> shift}{suffix}"
    return str(amount)


def age(created: object, now: datetime) -> str:
    """kubectl's short age (``37s``, ``5m10s``, ``3h``, ``2d4h``); ``<unknown>`` unset."""
    if not isinstance(created, str) or not created:
        return "<unknown>"
    try:
        stamp = parse_rfc3339(created)
    except InvalidValueError:
        return "<unknown>"
    return human_duration(now - stamp)


def human_duration(elapsed: timedelta) -> str:
    """``k8s.io/apimachinery/pkg/util/duration.HumanDuration``."""
    seconds = int(elapsed.total_seconds())
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    if seconds < 60 * 2:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        rest = seconds % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 60 * 3:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d{rest}h" if rest else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def _ready_reason(status: dict[str, Any]) -> str:
    for condition in status.get("conditions") or ():
        if condition.get("type") == CONDITION_READY:
            return str(condition.get("reason", ""))
    return ""

"""The ``Sandbox`` object as served (``agents.x-k8s.io/v1beta1``), made from an inventory entry.

A Sandbox is never stored: every read synthesizes it from the entry that a node's inventory
reports, so it carries no UID, and its ``resourceVersion`` is a hash of the entry's fields.
An entry that has not changed keeps its resourceVersion; a change in any hashed field gives
a new one, which is what a watch reports as MODIFIED.

The label and annotation keys are defined here once; everything that reads or writes them
imports them from this module.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from sandboxctl.core.model import Entry, split_name
from sandboxctl.core.snapshot import Located
from sandboxctl.core.timestamps import format_rfc3339

API_VERSION: Final = "agents.x-k8s.io/v1beta1"
KIND: Final = "Sandbox"

_PREFIX: Final = "sandbox.cocoonstack.io/"

LABEL_NODE: Final = _PREFIX + "node"
LABEL_PHASE: Final = _PREFIX + "phase"
LABEL_TEMPLATE: Final = _PREFIX + "template"
LABEL_CLAIM: Final = _PREFIX + "claim"

ANNOTATION_CLAIM_ID: Final = _PREFIX + "claim-id"
ANNOTATION_DEADLINE: Final = _PREFIX + "deadline"
ANNOTATION_METADATA: Final = _PREFIX + "metadata"
ANNOTATION_CPU_COUNT: Final = _PREFIX + "cpu-count"
ANNOTATION_MEMORY_BYTES: Final = _PREFIX + "memory-bytes"

FIELD_NAME: Final = "metadata.name"
FIELD_NAMESPACE: Final = "metadata.namespace"
FIELD_NODE_NAME: Final = "status.nodeName"

CONDITION_READY: Final = "Ready"
READY_PHASES: Final = frozenset({"running", "ready"})
UNKNOWN_REASON: Final = "Unknown"

FNV64_OFFSET: Final = 0xCBF29CE484222325
FNV64_PRIME: Final = 0x100000001B3
_MASK64: Final = 0xFFFFFFFFFFFFFFFF

_LABEL_VALUE_MAX = 63
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def fnv1a_64(data: bytes) -> int:
    """FNV-1a, 64 bits: xor each byte in, then multiply by the FNV prime modulo 2**64."""
    value = FNV64_OFFSET
    for byte in data:
        value = ((value ^ byte) * FNV64_PRIME) & _MASK64
    return value


def is_label_value(text: str) -> bool:
    """Whether Kubernetes accepts ``text`` as a label value (at most 63 characters of
    alphanumerics, ``-``, ``_`` and ``.``, starting and ending alphanumeric; empty is valid)."""
    return len(text) <= _LABEL_VALUE_MAX and _LABEL_VALUE.fullmatch(text) is not None


def resource_version(entry: Entry) -> str:
    """The decimal FNV-1a 64 hash of the entry's identifying fields.

    The hashed text is ``ns/name|id|phase|claimRef|addr|template|deadline|claimedAt`` with
    the deadline as RFC 3339 UTC and claimedAt as Unix seconds, each empty when unset.
    ``metadata``, ``cpuCount`` and ``memoryBytes`` are not hashed: a change to them alone
    keeps the resourceVersion (and so gives no MODIFIED in a watch).
    """
    namespace, name = split_name(entry.name)
    parts = (
        f"{namespace}/{name}",
        entry.id,
        entry.phase,
        entry.claim_ref,
        entry.addr,
        entry.template,
        format_rfc3339(entry.deadline) if entry.deadline is not None else "",
        str(_unix_seconds(entry.claimed_at)) if entry.claimed_at is not None else "",
    )
    return str(fnv1a_64("|".join(parts).encode("utf-8")))


def sandbox_labels(located: Located) -> dict[str, str]:
    """The labels a served Sandbox carries, without building the object.

    The node label is always present; phase, template and claim (the name part of the
    claimRef) only when non-empty and valid as a label value, so a registry image as a
    template leaves the template label out.
    """
    entry = located.entry
    labels = {LABEL_NODE: located.node}
    claim = split_name(entry.claim_ref)[1] if entry.claim_ref else ""
    for key, value in ((LABEL_PHASE, entry.phase), (LABEL_TEMPLATE, entry.template)):
        if value and is_label_value(value):
            labels[key] = value
    if claim and is_label_value(claim):
        labels[LABEL_CLAIM] = claim
    return labels


def sandbox_fields(located: Located) -> dict[str, str]:
    """The fields a field selector may name: metadata.name, metadata.namespace, status.nodeName."""
    namespace, name = split_name(located.entry.name)
    return {FIELD_NAME: name, FIELD_NAMESPACE: namespace, FIELD_NODE_NAME: located.node}


def sandbox_annotations(located: Located) -> dict[str, str]:
    """The annotations of a served Sandbox: only those the entry reports."""
    entry = located.entry
    annotations: dict[str, str] = {}
    if entry.id:
        annotations[ANNOTATION_CLAIM_ID] = entry.id
    if entry.deadline is not None:
        annotations[ANNOTATION_DEADLINE] = format_rfc3339(entry.deadline)
    if entry.metadata:
        annotations[ANNOTATION_METADATA] = entry.metadata
    if entry.cpu_count is not None:
        annotations[ANNOTATION_CPU_COUNT] = str(entry.cpu_count)
    if entry.memory_bytes is not None:
        annotations[ANNOTATION_MEMORY_BYTES] = str(entry.memory_bytes)
    return annotations


def is_ready(phase: str) -> bool:
    """Ready is True iff the phase is Running or Ready, compared case-insensitively."""
    return phase.lower() in READY_PHASES


def sandbox_object(located: Located) -> dict[str, Any]:
    """The served Sandbox for one entry on one node, as a JSON-ready dict (no UID)."""
    entry = located.entry
    namespace, name = split_name(entry.name)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if entry.claimed_at is not None:
        metadata["creationTimestamp"] = format_rfc3339(entry.claimed_at)
    metadata["resourceVersion"] = resource_version(entry)
    metadata["labels"] = sandbox_labels(located)
    annotations = sandbox_annotations(located)
    if annotations:
        metadata["annotations"] = annotations
    status: dict[str, Any] = {"nodeName": located.node}
    host = addr_host(entry.addr)
    if host:
        status["podIPs"] = [{"ip": host}]
    status["conditions"] = [
        {
            "type": CONDITION_READY,
            "status": "True" if is_ready(entry.phase) else "False",
            "reason": entry.phase or UNKNOWN_REASON,
            "message": f'phase "{entry.phase}" reported by node "{located.node}" inventory',
        }
    ]
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "status": status}


def addr_host(addr: str) -> str:
    """The host part of ``host:port``, ``[v6]:port``, a bare host, or an ``http://`` origin."""
    rest = addr.strip()
    _, scheme_sep, after = rest.partition("://")
    if scheme_sep:
        rest = after
    rest = rest.split("/", 1)[0]
    if rest.startswith("["):
        end = rest.find("]")
        return rest[1:end] if end > 0 else rest[1:]
    if rest.count(":") == 1:
        return rest.partition(":")[0]
    return rest  # a bare host, or an unbracketed IPv6 address without a port


def _unix_seconds(value: datetime) -> int:
    """Whole seconds since the epoch, floored, exact for any aware datetime."""
    return (value - _EPOCH) // timedelta(seconds=1)

"""The ``Sandbox`` object as served (``agents.x-k8s.io/v1beta1``), made from an inventory entry.

A Sandbox is never stored: it is synthesized from the entry that a node's inventory
reports, so it carries no UID. Its ``resourceVersion`` is the number the store's ledger
gave the change that made it (an unchanged entry keeps it). Every answer that shows one
(a list, a get, a watch event, a create's answer) is made by :func:`sandbox_object`.

The label and annotation keys are defined here once; everything that reads or writes them
imports them from this module.
"""

from __future__ import annotations

import re
from typing import Any, Final

from sandboxctl.core.ids import public_id
from sandboxctl.core.model import split_name
from sandboxctl.core.names import SANDBOXES
from sandboxctl.core.snapshot import Located
from sandboxctl.core.timestamps import format_rfc3339

API_VERSION: Final = SANDBOXES.api_version
KIND: Final = SANDBOXES.kind

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

_LABEL_VALUE_MAX = 63
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def is_label_value(text: str) -> bool:
    """Whether Kubernetes accepts ``text`` as a label value (at most 63 characters of
    alphanumerics, ``-``, ``_`` and ``.``, starting and ending alphanumeric; empty is valid)."""
    return len(text) <= _LABEL_VALUE_MAX and _LABEL_VALUE.fullmatch(text) is not None


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
    """The annotations of a served Sandbox: only those the entry reports. The id is the
    SDK's spelling (``sb-...``), the one every API shows a user."""
    entry = located.entry
    annotations: dict[str, str] = {}
    if entry.id:
        annotations[ANNOTATION_CLAIM_ID] = public_id(entry.id)
    if entry.deadline is not None:
        annotations[ANNOTATION_DEADLINE] = format_rfc3339(entry.deadline)
    if entry.metadata.text:
        annotations[ANNOTATION_METADATA] = entry.metadata.text
    if entry.cpu_count is not None:
        annotations[ANNOTATION_CPU_COUNT] = str(entry.cpu_count)
    if entry.memory_bytes is not None:
        annotations[ANNOTATION_MEMORY_BYTES] = str(entry.memory_bytes)
    return annotations


def is_ready(phase: str) -> bool:
    """Ready is True iff the phase is Running or Ready, compared case-insensitively."""
    return phase.lower() in READY_PHASES


def sandbox_object(located: Located, resource_version: str) -> dict[str, Any]:
    """The served Sandbox for one entry on one node, as a JSON-ready dict (no UID).

    ``resource_version`` is given by the store's ledger, which numbers every change it
    observes (see ``store/ledger.py``)."""
    entry = located.entry
    namespace, name = split_name(entry.name)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if entry.claimed_at is not None:
        metadata["creationTimestamp"] = format_rfc3339(entry.claimed_at)
    metadata["resourceVersion"] = resource_version
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

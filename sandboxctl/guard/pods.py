"""What the guard reads of a pod and of a node: small frozen views of the API's JSON.

Pure: no I/O. A view is built once per object version (the informer replaces an object's
dict on every change), so a tick over thousands of pods reads attributes, not JSON.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.timestamps import parse_rfc3339

ANNOTATION: Final = "karpenter.sh/do-not-disrupt"
VALUE: Final = "true"
DISRUPTED_TAINT: Final = "karpenter.sh/disrupted"
NODEPOOL_LABEL: Final = "karpenter.sh/nodepool"
OVERRIDE_LABEL: Final = "sandbox.cocoonstack.io/guard"
DEFAULT_POD_GRACE_SECONDS: Final = 30  # a pod without terminationGracePeriodSeconds
WORKER_GRACE_SECONDS: Final = 600  # a worker's drain window on SIGTERM
TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})


class Override(enum.StrEnum):
    """The override label's value: ``pin`` keeps the annotation, ``off`` keeps it away."""

    NONE = ""
    PIN = "pin"
    OFF = "off"
    INVALID = "invalid"  # any other value: ignored (and logged by the reconciler)


@dataclass(frozen=True, slots=True)
class PodView:
    uid: str
    namespace: str
    name: str
    resource_version: str
    node: str
    ip: str
    phase: str
    annotation: str | None  # the guard's annotation as found; None when absent
    override: Override
    override_text: str
    owner: str | None  # the owner label's value, when an owner label is configured
    deletion_timestamp: datetime | None
    grace_seconds: int
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    plain: bool = False  # live, not terminal, no override: the reconcile's fast path

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def terminating(self) -> bool:
        return self.deletion_timestamp is not None

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def annotated(self) -> bool:
        """Exactly ``"true"``: any other value counts as unannotated."""
        return self.annotation == VALUE


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    nodepool: str  # the karpenter.sh/nodepool label; "" on a node Karpenter does not own
    disrupted: bool  # tainted karpenter.sh/disrupted (Karpenter is draining it)


@dataclass(frozen=True, slots=True)
class PodShape:
    """How to read pods: which annotation the guard manages and which labels it honours."""

    annotation: str = ANNOTATION
    override_label: str = OVERRIDE_LABEL
    owner_label: str | None = None


def pod_view(obj: Mapping[str, Any], shape: PodShape = PodShape()) -> PodView:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    override_text = str(labels.get(shape.override_label, ""))
    grace = spec.get("terminationGracePeriodSeconds")
    override = _override(override_text)
    deletion = _time(meta.get("deletionTimestamp"))
    phase = str(status.get("phase") or "")
    return PodView(
        uid=str(meta.get("uid") or ""),
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        node=str(spec.get("nodeName") or ""),
        ip=str(status.get("podIP") or ""),
        phase=phase,
        annotation=annotations.get(shape.annotation),
        override=override,
        override_text=override_text,
        owner=labels.get(shape.owner_label) if shape.owner_label else None,
        deletion_timestamp=deletion,
        grace_seconds=int(grace) if isinstance(grace, int) else DEFAULT_POD_GRACE_SECONDS,
        labels=labels,
        annotations=annotations,
        plain=deletion is None and phase not in TERMINAL_PHASES and override is Override.NONE,
    )


def node_view(obj: Mapping[str, Any]) -> NodeView:
    meta = obj.get("metadata") or {}
    taints = (obj.get("spec") or {}).get("taints") or []
    return NodeView(
        name=str(meta.get("name") or ""),
        nodepool=str((meta.get("labels") or {}).get(NODEPOOL_LABEL) or ""),
        disrupted=any(isinstance(t, dict) and t.get("key") == DISRUPTED_TAINT for t in taints),
    )


def born_guarded(
    manifest: Mapping[str, Any],
    grace_seconds: int = WORKER_GRACE_SECONDS,
    annotation: str = ANNOTATION,
) -> dict[str, Any]:
    """A worker pod manifest as it should be created: already annotated (so the spawn
    window before the first tick is covered; the guard clears it once the pod is idle)
    and with a real drain window on SIGTERM, unless the manifest sets its own."""
    out = copy.deepcopy(dict(manifest))
    meta = out.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), annotation: VALUE}
    out.setdefault("spec", {}).setdefault("terminationGracePeriodSeconds", grace_seconds)
    return out


def _override(text: str) -> Override:
    if not text:
        return Override.NONE
    try:
        found = Override(text)
    except ValueError:
        return Override.INVALID
    return found if found in (Override.PIN, Override.OFF) else Override.INVALID


def _time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_rfc3339(value)
    except InvalidValueError:
        return None

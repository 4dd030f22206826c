"""The ``GuardStatus`` document a running guard serves on ``/status`` and
``guard-workers status`` prints: what is guarded, busy, annotated, mismatched, deferred.
Fields are only ever added."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sandboxctl.core.names import REPORTS_API_VERSION
from sandboxctl.core.timestamps import format_rfc3339
from sandboxctl.guard.decide import Busy, Clear, Decision, Keep, Op, Stamp, Wait, WaitReason
from sandboxctl.guard.health import HEALTHY, Deferred, Lost, Verdict, is_schedulable
from sandboxctl.guard.pods import NodeView, PodView

API_VERSION = REPORTS_API_VERSION
KIND = "GuardStatus"


def describe(decision: Decision) -> str:
    if isinstance(decision, Keep):
        return decision.reason.value
    if isinstance(decision, Wait):
        return f"{decision.op.value} after {decision.reason.value}"
    return decision.op.value


def mismatched(decision: Decision) -> bool:
    """The annotation differs from what the guard wants (an idle grace still running and
    a deliberate hold are not mismatches)."""
    if isinstance(decision, (Stamp, Clear)):
        return True
    return isinstance(decision, Wait) and decision.reason is not WaitReason.IDLE_GRACE


def wanted(decision: Decision, annotated: bool) -> bool:
    if isinstance(decision, Stamp):
        return True
    if isinstance(decision, Clear):
        return False
    if isinstance(decision, Wait):
        return decision.op is Op.STAMP or decision.reason is WaitReason.IDLE_GRACE
    return annotated


def pod_row(
    pod: PodView,
    busy: Busy,
    decision: Decision,
    verdict: Verdict,
    detail: str,
    node: NodeView | None,
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "namespace": pod.namespace,
        "name": pod.name,
        "uid": pod.uid,
        "node": pod.node,
        "nodePool": node.nodepool if node is not None else "",
        "busy": busy.value,
        "detail": detail,
        "annotated": pod.annotated,
        "annotation": pod.annotation,
        "wanted": wanted(decision, pod.annotated),
        "decision": describe(decision),
        "mismatched": mismatched(decision),
        "terminating": pod.terminating,
        "override": pod.override_text,
        "owner": pod.owner,
        "nodeDisrupted": bool(node is not None and node.disrupted),
        "schedulable": is_schedulable(pod, node),
        "health": "healthy",
    }
    if isinstance(verdict, Deferred):
        row["health"] = "deferred"
        row["deadline"] = format_rfc3339(verdict.deadline)
    elif isinstance(verdict, Lost):
        row["health"] = "lost"
        row["lostReason"] = verdict.reason.value
    return row


def status_document(
    header: Mapping[str, Any],
    pods: Sequence[PodView],
    previews: Mapping[str, tuple[Busy, Decision]],
    nodes: Mapping[str, NodeView],
    detail: Callable[[PodView], str],
    verdict: Callable[[str], Verdict] = lambda uid: HEALTHY,
) -> dict[str, Any]:
    rows = []
    for pod in sorted(pods, key=lambda p: p.key):
        busy, decision = previews[pod.uid]
        node = nodes.get(pod.node)
        rows.append(pod_row(pod, busy, decision, verdict(pod.uid), detail(pod), node))
    counts = {
        "guarded": len(rows),
        "busy": sum(1 for r in rows if r["busy"] == Busy.BUSY.value),
        "annotated": sum(1 for r in rows if r["annotated"]),
        "mismatched": sum(1 for r in rows if r["mismatched"]),
        "terminating": sum(1 for r in rows if r["terminating"]),
        "deferred": sum(1 for r in rows if r["health"] == "deferred"),
        "lost": sum(1 for r in rows if r["health"] == "lost"),
    }
    return {"apiVersion": API_VERSION, "kind": KIND, **header, "counts": counts, "pods": rows}

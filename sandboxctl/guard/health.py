"""The health guard for Terminating workers, and the schedulable predicate.

Pure. A worker whose pod is being deleted stops answering health checks while it still
drains its work (the incident: gRPC GracefulStop refuses new RPCs, probes included, while
streams go on). Declaring it lost then kills that work. So, once a worker has
failed ``threshold`` checks in a row:

* busy and Terminating: **deferred** until its drain deadline, ``deletionTimestamp`` (which
  is already the delete request plus the pod's grace) plus ``slack`` (the kubelet's
  one-time 2 s preStop extension, clock skew). A hard deadline: a pod an unreachable
  kubelet leaves Terminating forever is declared lost when it passes;
* idle and Terminating: **lost** at once; it must never be handed work again (8afdf27);
* not Terminating: **lost** (unresponsive).

Never issue a delete of your own: a later delete can only shorten the grace.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeAlias

from sandboxctl.guard.pods import NodeView, PodView

DEFAULT_DRAIN_SLACK = timedelta(seconds=30)
DEFAULT_FAIL_THRESHOLD = 3


class LostReason(enum.StrEnum):
    UNRESPONSIVE = "unresponsive"
    IDLE_TERMINATING = "idle-and-terminating"
    DRAIN_DEADLINE = "drain-deadline-passed"


@dataclass(frozen=True, slots=True)
class Healthy:
    pass


@dataclass(frozen=True, slots=True)
class Deferred:
    """Busy and draining: not lost before ``deadline``."""

    deadline: datetime


@dataclass(frozen=True, slots=True)
class Lost:
    reason: LostReason


Verdict: TypeAlias = Healthy | Deferred | Lost
HEALTHY = Healthy()


def is_terminating(pod: PodView | None) -> bool:
    """A pod with ``deletionTimestamp`` set. A missing pod is not (it is gone, which the
    caller learns from the pod's absence, not from this)."""
    return pod is not None and pod.deletion_timestamp is not None


def is_schedulable(pod: PodView, node: NodeView | None) -> bool:
    """May new work go to this worker? Not when its pod is Terminating, and not when its
    node carries ``karpenter.sh/disrupted`` (the taint lands before the pod is Terminating:
    new work there would pin a draining node for up to its grace period)."""
    if pod.deletion_timestamp is not None or pod.terminal:
        return False
    return node is None or not node.disrupted


def drain_deadline(pod: PodView, slack: timedelta = DEFAULT_DRAIN_SLACK) -> datetime | None:
    if pod.deletion_timestamp is None:
        return None
    return pod.deletion_timestamp + slack


def should_defer_lost(
    pod: PodView, busy: bool, now: datetime, slack: timedelta = DEFAULT_DRAIN_SLACK
) -> bool:
    """The 2a rule: a busy Terminating worker is not declared lost before its deadline."""
    deadline = drain_deadline(pod, slack)
    return busy and deadline is not None and now < deadline


def judge(
    pod: PodView,
    busy: bool,
    failures: int,
    now: datetime,
    threshold: int = DEFAULT_FAIL_THRESHOLD,
    slack: timedelta = DEFAULT_DRAIN_SLACK,
) -> Verdict:
    """The verdict after ``failures`` consecutive failed checks."""
    if failures < threshold:
        return HEALTHY
    deadline = drain_deadline(pod, slack)
    if deadline is None:
        return Lost(LostReason.UNRESPONSIVE)
    if not busy:
        return Lost(LostReason.IDLE_TERMINATING)
    if now < deadline:
        return Deferred(deadline)
    return Lost(LostReason.DRAIN_DEADLINE)

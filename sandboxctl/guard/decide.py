"""The reconcile rule: what one pod's annotation should be, compared with what it is.

Pure: the pod's view, its busy reading, this instance's memory of it and the monotonic
time go in; a decision comes out. Desired state is compared with the **observed**
annotation (the informer's copy of the pod), never with what this instance remembers
writing, so any instance clears a stale ``"true"`` an earlier one left (failover).

The rule, in order:

1. a Terminating or terminal pod is left alone: Karpenter ignores the annotation on it,
   and a patch would only race its deletion;
2. the override label wins: ``pin`` wants the annotation, ``off`` wants it gone;
3. otherwise busy wants it, idle wants it gone once the pod has been idle for
   ``idle_grace`` (short gaps between statements must not flap it), and an unknown
   reading (the source is failing) changes nothing;
4. wanted and present, or unwanted and absent: nothing to do. A value other than
   ``"true"`` (a duration, a typo) is overwritten when busy and left alone when idle;
5. a busy pod on a node tainted ``karpenter.sh/disrupted`` is not newly stamped: the drain
   has started, and a new stamp would only hold a half-drained node (forever without a
   NodePool ``terminationGracePeriod``). A stamp already there stays until the pod idles;
6. a change waits out this pod's backoff, and is not sent again while the informer has
   not yet shown the previous identical patch (same resourceVersion) within ``resend_after``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypeAlias

from sandboxctl.guard.pods import VALUE, Override, PodView


class Busy(enum.Enum):
    BUSY = "busy"
    IDLE = "idle"
    UNKNOWN = "unknown"


class Op(enum.StrEnum):
    STAMP = "stamp"
    CLEAR = "clear"


class KeepReason(enum.StrEnum):
    IN_SYNC = "in-sync"
    TERMINATING = "terminating"
    TERMINAL = "terminal"
    UNKNOWN = "busy-unknown"
    FOREIGN_VALUE = "foreign-value"  # idle, annotated with a value other than "true"
    DISRUPTED_NODE = "disrupted-node"


class WaitReason(enum.StrEnum):
    IDLE_GRACE = "idle-grace"
    BACKOFF = "backoff"
    IN_FLIGHT = "in-flight"  # the same patch was sent and the informer has not shown it yet


@dataclass(frozen=True, slots=True)
class Keep:
    """Nothing to send."""

    reason: KeepReason


@dataclass(frozen=True, slots=True)
class Wait:
    """A change is wanted, but not before ``until`` (monotonic seconds)."""

    op: Op
    reason: WaitReason
    until: float


@dataclass(frozen=True, slots=True)
class Stamp:
    """Set the annotation to ``"true"``; ``replaces`` is the foreign value it overwrites."""

    replaces: str | None = None
    op: Op = Op.STAMP


@dataclass(frozen=True, slots=True)
class Clear:
    """Remove the annotation."""

    op: Op = Op.CLEAR


Decision: TypeAlias = Keep | Wait | Stamp | Clear
Change: TypeAlias = Stamp | Clear

# Shared instances: the steady state allocates nothing.
IN_SYNC = Keep(KeepReason.IN_SYNC)
TERMINATING = Keep(KeepReason.TERMINATING)
TERMINAL = Keep(KeepReason.TERMINAL)
UNKNOWN = Keep(KeepReason.UNKNOWN)
FOREIGN_VALUE = Keep(KeepReason.FOREIGN_VALUE)
DISRUPTED_NODE = Keep(KeepReason.DISRUPTED_NODE)
STAMP = Stamp()
CLEAR = Clear()


@dataclass(frozen=True, slots=True)
class Rules:
    idle_grace: float = 0.0  # seconds
    resend_after: float = 2.0  # seconds; about one interval
    respect_disrupted_taint: bool = True


@dataclass(slots=True)
class Memory:
    """What this instance remembers of one pod (keyed by UID, never by name): when it went
    idle, the last patch it sent, its backoff. Never compared with the desired state."""

    idle_since: float | None = None
    sent_op: Op | None = None
    sent_version: str = ""
    sent_at: float = 0.0
    retry_at: float = 0.0
    failures: int = 0
    stamped: bool = False  # this instance set the annotation (else a clear is an orphan's)
    reading: Busy | None = None  # the reading last noted


def note_busy(memory: Memory, busy: Busy, now: float) -> None:
    """Track when the pod went idle (for ``idle_grace``); an unknown reading changes nothing.
    Noting the reading last noted again changes nothing either: callers may skip it."""
    memory.reading = busy
    if busy is Busy.BUSY:
        memory.idle_since = None
    elif busy is Busy.IDLE and memory.idle_since is None:
        memory.idle_since = now


def settled_reading(pod: PodView) -> Busy | None:
    """The reading for which :func:`decide` answers ``IN_SYNC`` whatever the memory and the
    time, if any: busy for a plain pod (live, no override) already annotated, idle for one
    without the annotation. A pod's steady state, known once per version of it: a tick
    decides only the pods whose reading is not theirs."""
    if not pod.plain:
        return None
    if pod.annotation == VALUE:
        return Busy.BUSY
    return Busy.IDLE if pod.annotation is None else None


def decide(
    pod: PodView, busy: Busy, memory: Memory, now: float, rules: Rules, node_disrupted: bool
) -> Decision:
    if pod.deletion_timestamp is not None:
        return TERMINATING
    if pod.terminal:
        return TERMINAL
    want = _wanted(pod.override, busy)
    if want is None:
        return UNKNOWN
    step = _to_stamp(pod, rules, node_disrupted) if want else _to_clear(pod, memory, now, rules)
    if isinstance(step, Stamp | Clear):
        return _paced(step, pod, memory, now, rules)
    return step


def _wanted(override: Override, busy: Busy) -> bool | None:
    """Rules 2 and 3: whether the annotation is wanted; None when nobody can tell."""
    if override is Override.PIN:
        return True
    if override is Override.OFF:
        return False
    if busy is Busy.BUSY:
        return True
    if busy is Busy.IDLE:
        return False
    return None


def _to_stamp(pod: PodView, rules: Rules, node_disrupted: bool) -> Keep | Stamp:
    """Rules 4 and 5, wanted: nothing when it is there, and no new stamp on a draining node."""
    if pod.annotation == VALUE:
        return IN_SYNC
    if node_disrupted and rules.respect_disrupted_taint and pod.override is not Override.PIN:
        return DISRUPTED_NODE
    return STAMP if pod.annotation is None else Stamp(replaces=pod.annotation)


def _to_clear(pod: PodView, memory: Memory, now: float, rules: Rules) -> Keep | Wait | Clear:
    """Rules 3 and 4, unwanted: nothing when it is absent or not ours, and an idle pod's
    annotation only once the idle grace has passed (``off`` clears at once)."""
    if pod.annotation is None:
        return IN_SYNC
    if pod.annotation != VALUE:
        return FOREIGN_VALUE
    if pod.override is not Override.OFF:
        since = memory.idle_since if memory.idle_since is not None else now
        if now < since + rules.idle_grace:
            return Wait(Op.CLEAR, WaitReason.IDLE_GRACE, since + rules.idle_grace)
    return CLEAR


def _paced(change: Change, pod: PodView, memory: Memory, now: float, rules: Rules) -> Decision:
    """Rule 6: a change waits out the pod's backoff, and the same patch is not sent again
    while the informer has not shown it (same resourceVersion) within ``resend_after``."""
    if memory.retry_at > now:
        return Wait(change.op, WaitReason.BACKOFF, memory.retry_at)
    if (
        memory.sent_op is change.op
        and memory.sent_version == pod.resource_version
        and now < memory.sent_at + rules.resend_after
    ):
        return Wait(change.op, WaitReason.IN_FLIGHT, memory.sent_at + rules.resend_after)
    return change


def backoff_seconds(failures: int, initial: float, maximum: float, jitter: float) -> float:
    """Exponential backoff after ``failures`` consecutive failures (1 -> ``initial``),
    capped at ``maximum``; ``jitter`` in [0, 1) spreads it by up to +20 %."""
    base: float = min(maximum, initial * 2.0 ** max(0, failures - 1))
    return base * (1.0 + 0.2 * jitter)


def merge_patch(annotation: str, op: Op, uid: str) -> dict[str, object]:
    """The JSON merge patch for one change. ``null`` deletes the key; ``uid`` makes a real
    API server refuse the patch (422, uid is immutable) if the name now holds another pod,
    so a plan made for one pod never lands on its successor."""
    value = "true" if op is Op.STAMP else None
    return {"metadata": {"uid": uid, "annotations": {annotation: value}}}

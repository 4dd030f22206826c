"""The reconcile rule and the health guard as matrices over plain values (pure)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from sandboxctl.guard.decide import (
    CLEAR,
    STAMP,
    Busy,
    Clear,
    Keep,
    KeepReason,
    Memory,
    Op,
    Rules,
    Stamp,
    Wait,
    WaitReason,
    backoff_seconds,
    decide,
    merge_patch,
)
from sandboxctl.guard.health import (
    HEALTHY,
    Deferred,
    Lost,
    LostReason,
    is_schedulable,
    judge,
    should_defer_lost,
)
from sandboxctl.guard.pods import ANNOTATION, NodeView, Override, pod_view
from tests.guard.cluster import T0

RULES = Rules(idle_grace=10.0, resend_after=2.0)


def pod(annotation: str | None = None, override: str = "", deleting: bool = False,
        phase: str = "Running", version: str = "7") -> Any:  # fmt: skip
    meta: dict[str, Any] = {
        "name": "w", "namespace": "n", "uid": "u1", "resourceVersion": version,
        "labels": {"sandbox.cocoonstack.io/guard": override} if override else {},
        "annotations": {ANNOTATION: annotation} if annotation is not None else {},
    }  # fmt: skip
    if deleting:
        meta["deletionTimestamp"] = "2026-06-04T12:10:00Z"
    return pod_view({"metadata": meta, "spec": {"nodeName": "n1"}, "status": {"phase": phase}})


@pytest.mark.parametrize(
    ("annotation", "override", "busy", "expected"),
    [
        (None, "", Busy.BUSY, STAMP),
        ("true", "", Busy.BUSY, Keep(KeepReason.IN_SYNC)),
        ("true", "", Busy.IDLE, CLEAR),  # idle since now + grace 10: see below
        (None, "", Busy.IDLE, Keep(KeepReason.IN_SYNC)),
        ("5m", "", Busy.IDLE, Keep(KeepReason.FOREIGN_VALUE)),
        ("5m", "", Busy.BUSY, Stamp(replaces="5m")),
        ("TRUE", "", Busy.BUSY, Stamp(replaces="TRUE")),
        (None, "", Busy.UNKNOWN, Keep(KeepReason.UNKNOWN)),
        ("true", "", Busy.UNKNOWN, Keep(KeepReason.UNKNOWN)),
        (None, "pin", Busy.IDLE, STAMP),
        (None, "pin", Busy.UNKNOWN, STAMP),
        ("true", "off", Busy.BUSY, CLEAR),  # off: no idle grace either
        ("true", "maybe", Busy.BUSY, Keep(KeepReason.IN_SYNC)),  # an unknown override: ignored
    ],
)
def test_desired_against_observed(
    annotation: str | None, override: str, busy: Busy, expected: Any
) -> None:
    memory = Memory(idle_since=0.0)  # idle long ago
    assert decide(pod(annotation, override), busy, memory, 100.0, RULES, False) == expected


def test_terminating_and_terminal_pods_are_left_alone() -> None:
    for busy in Busy:
        assert decide(pod(deleting=True), busy, Memory(), 0, RULES, False) == Keep(
            KeepReason.TERMINATING
        )
        assert decide(pod(phase="Failed"), busy, Memory(), 0, RULES, False) == Keep(
            KeepReason.TERMINAL
        )
    assert decide(pod("true", "pin", deleting=True), Busy.IDLE, Memory(), 0, RULES, False) == Keep(
        KeepReason.TERMINATING
    )


def test_the_idle_grace_runs_from_the_first_idle_reading() -> None:
    memory = Memory(idle_since=100.0)
    assert decide(pod("true"), Busy.IDLE, memory, 105.0, RULES, False) == Wait(
        Op.CLEAR, WaitReason.IDLE_GRACE, 110.0
    )
    assert decide(pod("true"), Busy.IDLE, memory, 110.0, RULES, False) == CLEAR


def test_backoff_and_in_flight_hold_a_change() -> None:
    held = Memory(idle_since=0.0, retry_at=50.0)
    assert decide(pod(), Busy.BUSY, held, 40.0, RULES, False) == Wait(
        Op.STAMP, WaitReason.BACKOFF, 50.0
    )
    sent = Memory(sent_op=Op.STAMP, sent_version="7", sent_at=40.0)
    assert decide(pod(), Busy.BUSY, sent, 41.0, RULES, False) == Wait(
        Op.STAMP, WaitReason.IN_FLIGHT, 42.0
    )
    assert decide(pod(), Busy.BUSY, sent, 42.0, RULES, False) == STAMP  # resent after a TTL
    assert decide(pod(version="8"), Busy.BUSY, sent, 41.0, RULES, False) == STAMP  # cache moved


def test_a_disrupted_node_takes_no_new_stamp_unless_pinned() -> None:
    assert decide(pod(), Busy.BUSY, Memory(), 0, RULES, True) == Keep(KeepReason.DISRUPTED_NODE)
    assert decide(pod("true"), Busy.BUSY, Memory(), 0, RULES, True) == Keep(KeepReason.IN_SYNC)
    assert decide(pod(None, "pin"), Busy.IDLE, Memory(), 0, RULES, True) == STAMP
    ignoring = Rules(respect_disrupted_taint=False)
    assert decide(pod(), Busy.BUSY, Memory(), 0, ignoring, True) == STAMP


def test_patches_and_backoff() -> None:
    assert merge_patch(ANNOTATION, Op.STAMP, "u1") == {
        "metadata": {"uid": "u1", "annotations": {ANNOTATION: "true"}}
    }
    assert merge_patch(ANNOTATION, Op.CLEAR, "u1")["metadata"]["annotations"] == {ANNOTATION: None}
    assert [backoff_seconds(n, 1.0, 5.0, 0.0) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 5.0]
    assert backoff_seconds(1, 1.0, 5.0, 0.999) < 1.2
    assert isinstance(STAMP, Stamp)
    assert isinstance(CLEAR, Clear)


def test_pod_views_read_what_the_guard_needs() -> None:
    view = pod("true", "pin", deleting=True)
    assert (view.annotated, view.override, view.terminating, view.grace_seconds) == (
        True,
        Override.PIN,
        True,
        30,  # unset: the Kubernetes default
    )


# --- the health guard -----------------------------------------------------------------------


def test_busy_and_terminating_defers_until_the_deadline() -> None:
    leaving = pod(deleting=True)
    assert leaving.deletion_timestamp is not None
    slack = timedelta(seconds=30)
    deadline = leaving.deletion_timestamp + slack
    assert should_defer_lost(leaving, True, deadline - timedelta(seconds=1), slack)
    assert not should_defer_lost(leaving, True, deadline, slack)
    assert not should_defer_lost(leaving, False, T0, slack)
    assert not should_defer_lost(pod(), True, T0, slack)  # a live pod is never deferred
    assert judge(leaving, True, 3, deadline - timedelta(seconds=1), 3, slack) == Deferred(deadline)


def test_idle_and_terminating_is_lost_at_once_and_live_is_unresponsive() -> None:
    assert judge(pod(deleting=True), False, 3, T0) == Lost(LostReason.IDLE_TERMINATING)
    assert judge(pod(), True, 3, T0) == Lost(LostReason.UNRESPONSIVE)
    assert judge(pod(), True, 2, T0) == HEALTHY  # below the threshold


def test_schedulable_excludes_terminating_pods_and_disrupted_nodes() -> None:
    assert is_schedulable(pod(), NodeView("n1", "p", False))
    assert is_schedulable(pod(), None)
    assert not is_schedulable(pod(deleting=True), NodeView("n1", "p", False))
    assert not is_schedulable(pod(), NodeView("n1", "p", True))
    assert not is_schedulable(pod(phase="Succeeded"), None)

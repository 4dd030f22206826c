"""Lease terms and the reaper, without sandboxes: the reaper is given its due leases
and records what it pauses and destroys."""

from __future__ import annotations

import threading

import pytest

from sandboxctl.agentapi.models import ClaimRequest
from sandboxctl.lifecycle import Stop
from sandboxctl.sandboxd.errors import BadRequest, Conflict
from sandboxctl.sandboxd.events import EventLog
from sandboxctl.sandboxd.leases import (
    DEFAULT_TTL_SECONDS,
    MAX_TTL_SECONDS,
    Reaper,
    check_claim_terms,
    is_due,
    lease_ttl,
)
from sandboxctl.sandboxd.state import SandboxRecord

NOW = 1_000_000.0


def _record(sandbox_id: str, deadline: float | None, on_expire: str = "destroy") -> SandboxRecord:
    return SandboxRecord(
        id=sandbox_id,
        token="t",
        template="base",
        net="none",
        size="small",
        uid=200_000,
        pid=1,
        start_time=1,
        pid_namespace=1,
        claimed=True,
        claim_ref="",
        metadata={},
        ttl_seconds=60,
        deadline=deadline,
        claimed_at=NOW - 60,
        on_expire=on_expire,
        hibernated=False,
        created_at=NOW - 120,
    )


def test_a_ttl_is_at_most_a_day_and_zero_is_the_default() -> None:
    assert lease_ttl(0) == DEFAULT_TTL_SECONDS
    assert lease_ttl(30) == 30
    assert lease_ttl(MAX_TTL_SECONDS + 1) == MAX_TTL_SECONDS
    with pytest.raises(BadRequest, match="ttl_seconds"):
        lease_ttl(-1)


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (ClaimRequest(template="base", on_expire="keep"), "on_expire"),
        (ClaimRequest(template="base", claim_ref="no-slash"), "claim_ref"),
        (ClaimRequest(template="base", claim_ref="a/b/c"), "claim_ref"),
        (ClaimRequest(template="base", metadata={str(i): "" for i in range(17)}), "pairs"),
        (ClaimRequest(template="base", metadata={"k": "v" * 4096}), "bytes"),
    ],
)
def test_claim_terms_are_checked(request_: ClaimRequest, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        check_claim_terms(request_)


def test_a_lease_is_due_at_its_deadline_only_when_claimed() -> None:
    assert is_due(_record("a", NOW), NOW)
    assert not is_due(_record("a", NOW + 1), NOW)
    assert not is_due(_record("a", None), NOW)
    warm = _record("a", NOW)
    warm.claimed = False
    assert not is_due(warm, NOW)


def test_the_reaper_pauses_or_destroys_and_skips_what_someone_else_ended() -> None:
    paused: list[str] = []
    records = [
        _record("sb_pause", NOW, on_expire="pause"),
        _record("sb_destroy", NOW),
        _record("sb_gone", NOW),
        _record("sb_raced", NOW, on_expire="pause"),
    ]

    def pause(sandbox_id: str) -> None:
        if sandbox_id == "sb_raced":
            raise Conflict("already hibernated")
        paused.append(sandbox_id)

    events = EventLog(now=lambda: NOW)
    reaper = Reaper(
        due=lambda now: [r for r in records if is_due(r, now)],
        pause=pause,
        destroy=lambda sandbox_id: sandbox_id != "sb_gone",
        events=events,
        now=lambda: NOW,
        interval=1.0,
    )
    assert reaper.reap() == [("sb_pause", "paused"), ("sb_destroy", "destroyed")]
    assert paused == ["sb_pause"]


def test_the_reaper_loop_reaps_each_interval_until_stopping() -> None:
    stopping = Stop()
    asked: list[float] = []

    def due(now: float) -> list[SandboxRecord]:
        asked.append(now)
        if len(asked) == 3:
            stopping.set()
        return []

    reaper = Reaper(due, lambda _: None, lambda _: True, EventLog(), lambda: NOW, 0.001)
    loop = threading.Thread(target=reaper.run, args=(stopping,), daemon=True)
    loop.start()
    loop.join(timeout=10)
    assert not loop.is_alive()
    assert len(asked) == 3

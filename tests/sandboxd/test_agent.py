"""The agent's rules over real sandboxes: warm pools, leases, capacity, adoption."""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
import threading
from datetime import timedelta

import pytest

from sandboxctl.agentapi import ClaimRequest
from sandboxctl.clock import ManualClock
from sandboxctl.core.model import PoolKey
from sandboxctl.lifecycle import EXIT_FAILED, Stop
from sandboxctl.sandboxd import procfs
from sandboxctl.sandboxd.agent import Agent
from sandboxctl.sandboxd.errors import (
    AtCapacity,
    BadRequest,
    Conflict,
    NoSuchSandbox,
    StateDirInUse,
    UnknownTemplate,
)
from sandboxctl.sandboxd.runtime import RuntimeFailure
from sandboxctl.sandboxd.server import serve
from sandboxctl.serving import bind
from tests.sandboxd.conftest import BASE, T0
from tests.sandboxd.servers import wait_until


def _warm(agent: Agent, key: PoolKey = BASE) -> int:
    return next(p.warm for p in agent.info().pools if p.key.template == key.template)


def _alive(agent: Agent, sandbox_id: str) -> bool:
    record = agent._records.get(sandbox_id)
    return record is not None and agent.runtime.alive(agent.identity(record))


def test_a_claim_takes_a_warm_sandbox_and_the_refill_restores_the_pool(agent: Agent) -> None:
    assert agent.refill_once() == 2
    warm_ids = agent.pools.warm(BASE)

    record = agent.claim(ClaimRequest(template="base", claim_ref="team/a", metadata={"k": "v"}))

    assert record.id == warm_ids[0]
    assert record.token
    assert record.deadline == (T0 + timedelta(seconds=300)).timestamp()
    assert record.claimed_at == T0.timestamp()
    assert _warm(agent) == 1
    assert agent.info().claimed == 1
    assert agent.refill_once() == 1
    assert _warm(agent) == 2


def test_a_key_without_warm_sandboxes_is_created_cold(agent: Agent) -> None:
    record = agent.claim(ClaimRequest(template="base", size="medium", net="egress"))
    assert record.key == PoolKey("base", "egress", "medium")
    assert _alive(agent, record.id)


def test_release_destroys_and_a_second_release_is_not_found(agent: Agent) -> None:
    record = agent.claim(ClaimRequest(template="base"))
    identity = agent.identity(record)

    agent.release(record.id)

    assert not agent.runtime.alive(identity)
    assert agent.sandboxes() == []
    with pytest.raises(NoSuchSandbox):
        agent.release(record.id)


def test_renew_moves_the_deadline_and_caps_it_at_a_day(agent: Agent, clock: ManualClock) -> None:
    record = agent.claim(ClaimRequest(template="base", ttl_seconds=60))
    clock.advance(100)

    renewed = agent.renew(record.id, 600, None)
    assert renewed.deadline == (T0 + timedelta(seconds=700)).timestamp()

    capped = agent.renew(record.id, 10 * 24 * 3600, None)
    assert capped.deadline == (T0 + timedelta(seconds=100, hours=24)).timestamp()


def test_a_lease_expires_at_its_deadline_and_not_before(agent: Agent, clock: ManualClock) -> None:
    record = agent.claim(ClaimRequest(template="base", ttl_seconds=60))
    identity = agent.identity(record)

    clock.advance(59)
    assert agent.reap() == []
    assert agent.runtime.alive(identity)

    clock.advance(1)
    assert agent.reap() == [(record.id, "destroyed")]
    assert not agent.runtime.alive(identity)
    assert agent.sandboxes() == []


def test_on_expire_pause_hibernates_and_wake_grants_a_fresh_lease(
    agent: Agent, clock: ManualClock
) -> None:
    record = agent.claim(ClaimRequest(template="base", ttl_seconds=60, on_expire="pause"))
    clock.advance(61)

    assert agent.reap() == [(record.id, "paused")]
    assert agent.get(record.id).hibernated
    assert agent.reap() == []  # already paused: nothing more to do
    assert _alive(agent, record.id)

    agent.wake(record.id)
    assert agent.get(record.id).deadline == (T0 + timedelta(seconds=121)).timestamp()


def test_hibernate_and_wake_each_refuse_the_wrong_state(agent: Agent) -> None:
    record = agent.claim(ClaimRequest(template="base"))
    with pytest.raises(Conflict):
        agent.wake(record.id)
    agent.hibernate(record.id)
    assert agent.info().hibernated == 1
    with pytest.raises(Conflict):
        agent.hibernate(record.id)
    agent.wake(record.id)
    assert not agent.get(record.id).hibernated


def test_at_capacity_a_claim_is_refused(make_agent) -> None:  # type: ignore[no-untyped-def]
    agent: Agent = make_agent(max_sandboxes=2, pools={})
    agent.claim(ClaimRequest(template="base"))
    agent.claim(ClaimRequest(template="base"))
    assert agent.info().at_capacity is True
    with pytest.raises(AtCapacity):
        agent.claim(ClaimRequest(template="base"))


def test_a_cold_claim_may_take_the_place_of_a_warm_sandbox(make_agent) -> None:  # type: ignore[no-untyped-def]
    agent: Agent = make_agent(max_sandboxes=2, pools={BASE: 2})
    agent.refill_once()

    record = agent.claim(ClaimRequest(template="base", size="large"))

    assert record.size == "large"
    assert _warm(agent) == 1
    assert len(agent._records) == 2


def test_set_pools_replaces_every_target_and_drains_the_rest(agent: Agent) -> None:
    agent.refill_once()
    drained = agent.pools.warm(BASE)
    medium = PoolKey("base", "none", "medium")

    agent.set_pools({medium: 1})
    agent.refill_once()

    pools = {(p.key.size, p.target, p.warm) for p in agent.info().pools}
    assert pools == {("medium", 1, 1)}
    assert not any(sandbox_id in agent._records for sandbox_id in drained)


@pytest.mark.parametrize(
    ("request_", "error"),
    [
        (ClaimRequest(template="nope"), UnknownTemplate),
        (ClaimRequest(template="base", net="wifi"), BadRequest),
        (ClaimRequest(template="base", size="huge"), BadRequest),
        (ClaimRequest(template="base", ttl_seconds=-1), BadRequest),
        (ClaimRequest(template="base", on_expire="explode"), BadRequest),
        (ClaimRequest(template="base", metadata={str(i): "v" for i in range(17)}), BadRequest),
        (ClaimRequest(template="base", metadata={"k": "v" * 5000}), BadRequest),
        (ClaimRequest(template="base", claim_ref="no-namespace"), BadRequest),
        (ClaimRequest(template="base", env={"1X": "v"}), BadRequest),
        (ClaimRequest(template="base", env={"A-B": "v"}), BadRequest),
        (ClaimRequest(template="base", env={"A=B": "v"}), BadRequest),
        (ClaimRequest(template="base", env={"": "v"}), BadRequest),
        (ClaimRequest(template="base", env={"NAÏVE": "v"}), BadRequest),
        (ClaimRequest(template="base", env={"A\n": "v"}), BadRequest),
        (ClaimRequest(template="base", env={"A": "x\0y"}), BadRequest),
        (ClaimRequest(template="base", env={f"V{i}": "" for i in range(257)}), BadRequest),
        (ClaimRequest(template="base", env={"A": "v" * (64 << 10)}), BadRequest),
    ],
)
def test_bad_claims_change_nothing(agent: Agent, request_: ClaimRequest, error: type) -> None:
    with pytest.raises(error):
        agent.claim(request_)
    assert agent._records == {}


def test_a_restarted_agent_adopts_every_live_sandbox(make_agent) -> None:  # type: ignore[no-untyped-def]
    first: Agent = make_agent(pools={})
    kept = first.claim(ClaimRequest(template="base", claim_ref="t/a", metadata={"k": "v"}))
    died = first.claim(ClaimRequest(template="base", claim_ref="t/b"))
    died_identity = first.identity(died)
    os.kill(died.pid, signal.SIGKILL)  # its init dies, and the pid namespace with it
    wait_until(lambda: not first.runtime.alive(died_identity), what="the init to die")

    first.stop()  # what the agent leaves behind when it goes away: running sandboxes
    second: Agent = make_agent(pools={})  # the same state dir
    report = second.adopt()

    assert report.adopted == (kept.id,)
    assert report.cleaned == (died.id,)
    again = second.get(kept.id)
    assert (again.token, again.deadline, again.metadata, again.claim_ref) == (
        kept.token,
        kept.deadline,
        {"k": "v"},
        "t/a",
    )
    assert not second.runtime.alive(died_identity)


def test_a_recycled_pid_is_never_adopted(make_agent, state_dir) -> None:  # type: ignore[no-untyped-def]
    first: Agent = make_agent(pools={})
    record = first.claim(ClaimRequest(template="base"))
    db = sqlite3.connect(state_dir / "sandboxd.sqlite")
    # Same pid, another process start: what a recycled pid looks like.
    db.execute("UPDATE sandboxes SET start_time = start_time + 1 WHERE id = ?", (record.id,))
    db.commit()
    db.close()

    first.stop()
    second: Agent = make_agent(pools={})
    report = second.adopt()

    assert report.adopted == ()
    assert report.cleaned == (record.id,)


def test_two_agents_never_share_a_state_dir(agent: Agent, make_agent) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(StateDirInUse, match="in use by another running agent"):
        make_agent()


def test_adopted_warm_sandboxes_beyond_the_target_are_drained(make_agent) -> None:  # type: ignore[no-untyped-def]
    first: Agent = make_agent(pools={BASE: 2})
    first.refill_once()
    first.stop()

    second: Agent = make_agent(pools={BASE: 1})
    second.adopt()
    assert second.refill_once() == 0

    assert _warm(second) == 1
    assert len(second._records) == 1


def test_a_claim_ref_needs_a_namespace_and_a_name(agent: Agent) -> None:
    for ref in ("/", "a/", "/b", "a/b/c"):
        with pytest.raises(BadRequest):
            agent.claim(ClaimRequest(template="base", claim_ref=ref))


def test_a_claims_env_is_kept_with_the_claim_and_across_a_restart(make_agent) -> None:  # type: ignore[no-untyped-def]
    env = {"FOO": "bar", "_x1": "with spaces = and 'quotes'", "EMPTY": ""}
    first: Agent = make_agent(pools={BASE: 1})
    first.refill_once()
    warm_id = first.pools.warm(BASE)[0]
    assert first._records[warm_id].env == {}

    record = first.claim(ClaimRequest(template="base", env=env))
    assert record.id == warm_id  # a warm sandbox, started before its claim, gets it too
    assert first.spec(record).env == env
    plain = first.claim(ClaimRequest(template="base"))
    assert first.spec(plain).env == {}

    first.stop()
    second: Agent = make_agent(pools={})
    assert set(second.adopt().adopted) == {record.id, plain.id}
    assert second.get(record.id).env == env
    assert second.spec(second.get(record.id)).env == env
    assert second.get(plain.id).env == {}


def test_env_at_the_limits_is_accepted(agent: Agent) -> None:
    many = {f"V{i}": "" for i in range(256)}
    assert agent.claim(ClaimRequest(template="base", env=many)).env == many
    big = {"A": "v" * ((64 << 10) - 1)}
    assert agent.claim(ClaimRequest(template="base", env=big)).env == big


def test_a_bad_env_value_is_never_echoed(agent: Agent) -> None:
    with pytest.raises(BadRequest) as refused:
        agent.claim(ClaimRequest(template="base", env={"TOKEN": "hunter2\0"}))
    assert str(refused.value) == "env.TOKEN: the value contains a NUL byte"


# The table as agents before claim env created it.
_OLD_SCHEMA = """
CREATE TABLE sandboxes (
    id TEXT PRIMARY KEY, token TEXT NOT NULL, template TEXT NOT NULL, net TEXT NOT NULL,
    size TEXT NOT NULL, uid INTEGER NOT NULL, pid INTEGER NOT NULL,
    start_time INTEGER NOT NULL, pid_namespace INTEGER NOT NULL, claimed INTEGER NOT NULL,
    claim_ref TEXT NOT NULL, metadata TEXT NOT NULL, ttl_seconds INTEGER NOT NULL,
    deadline REAL, claimed_at REAL, on_expire TEXT NOT NULL, hibernated INTEGER NOT NULL,
    created_at REAL NOT NULL
);
"""


def test_a_state_database_from_before_claim_env_is_adopted(make_agent, state_dir) -> None:  # type: ignore[no-untyped-def]
    first: Agent = make_agent(pools={})
    kept = first.claim(ClaimRequest(template="base", claim_ref="t/a", metadata={"k": "v"}))
    first.stop()
    # Rewrite the database as an older agent would have left it: no env column, 0644.
    path = state_dir / "sandboxd.sqlite"
    db = sqlite3.connect(path)
    added = ("env", "address", "network")  # columns of later agents
    columns = [row[1] for row in db.execute("PRAGMA table_info(sandboxes)") if row[1] not in added]
    rows = db.execute(f"SELECT {','.join(columns)} FROM sandboxes").fetchall()
    db.execute("DROP TABLE sandboxes")
    db.executescript(_OLD_SCHEMA)
    marks = ",".join("?" * len(columns))
    db.executemany(f"INSERT INTO sandboxes ({','.join(columns)}) VALUES ({marks})", rows)
    db.commit()
    db.close()
    path.chmod(0o644)

    second: Agent = make_agent(pools={})
    assert second.adopt().adopted == (kept.id,)
    again = second.get(kept.id)
    assert (again.token, again.metadata, again.env) == (kept.token, {"k": "v"}, {})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # The new column is written and read like any other.
    claimed = second.claim(ClaimRequest(template="base", env={"FOO": "bar"}))
    second.stop()
    third: Agent = make_agent(pools={})
    third.adopt()
    assert third.get(claimed.id).env == {"FOO": "bar"}


def test_the_state_database_is_readable_by_its_owner_only(agent: Agent, state_dir) -> None:  # type: ignore[no-untyped-def]
    # It holds every token and env; a base-template sandbox sees the host's files.
    agent.claim(ClaimRequest(template="base", env={"SECRET": "s"}))
    files = sorted(state_dir.glob("sandboxd.sqlite*"))
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in files}
    assert modes == {
        name: 0o600 for name in ("sandboxd.sqlite", "sandboxd.sqlite-shm", "sandboxd.sqlite-wal")
    }


def test_a_crashed_loop_of_the_agent_stops_its_process_with_exit_1(
    make_agent, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    """The agent's loops are parts of serve-sandboxd's process manager: one that raises
    stops the process with the failure exit code, not just its own thread."""
    agent: Agent = make_agent(pools={})

    def crash(stopping: Stop) -> None:
        raise RuntimeError("a reaper bug")

    agent._reaper.run = crash  # type: ignore[method-assign]
    # Only a safety net for a serve that does not see the crash: it then stops in order
    # (exit 0) and the assertion says so.
    watchdog = threading.Timer(30, os.kill, (os.getpid(), signal.SIGTERM))
    watchdog.start()
    try:
        with bind("127.0.0.1", 0) as sock:
            code = serve(agent, sock, None, destroy_on_exit=True)
    finally:
        watchdog.cancel()
    assert code == EXIT_FAILED
    assert "lease reaper: RuntimeError('a reaper bug')" in caplog.text


class _GatedStart:
    """The launcher's start held at its door until ``gate`` opens: a claim in flight."""

    def __init__(self, agent: Agent) -> None:
        self.entered = threading.Event()
        self.gate = threading.Event()
        self._start = agent._launcher.start
        self.outcome: list[object] = []

    def __call__(self, key: PoolKey, uid: int) -> object:
        self.entered.set()
        assert self.gate.wait(30)
        return self._start(key, uid)

    def claim(self, agent: Agent) -> threading.Thread:
        def run() -> None:
            try:
                self.outcome.append(agent.claim(ClaimRequest(template="base")))
            except Exception as error:
                self.outcome.append(error)

        thread = threading.Thread(target=run)
        thread.start()
        assert self.entered.wait(10)
        return thread


def _stop_beside(agent: Agent, gated: _GatedStart, claim: threading.Thread) -> None:
    stopper = threading.Thread(target=agent.stop, kwargs={"destroy": True})
    stopper.start()
    wait_until(lambda: agent._stopped, what="the stop to begin")
    gated.gate.set()
    claim.join(60)
    stopper.join(60)
    assert not claim.is_alive()
    assert not stopper.is_alive()


def test_a_stop_waits_for_a_claim_still_starting_and_destroys_its_sandbox(
    make_agent, uid_base: int
) -> None:  # type: ignore[no-untyped-def]
    agent: Agent = make_agent(pools={})
    gated = _GatedStart(agent)
    agent._launcher.start = gated  # type: ignore[assignment,method-assign]
    _stop_beside(agent, gated, gated.claim(agent))

    [record] = gated.outcome
    assert not isinstance(record, Exception), record
    assert not procfs.pids_of_uids(range(uid_base, uid_base + 6))


def test_a_start_that_outlives_the_stop_destroys_its_own_sandbox(
    make_agent, uid_base: int, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Its request outlived the server's grace and the stop's wait: no one else would
    destroy a sandbox the agent never recorded."""
    monkeypatch.setattr("sandboxctl.sandboxd.agent.LOOP_STOP_TIMEOUT", 0.0)
    agent: Agent = make_agent(pools={})
    gated = _GatedStart(agent)
    agent._launcher.start = gated  # type: ignore[assignment,method-assign]
    claim = gated.claim(agent)
    agent.stop(destroy=True)  # waits for nothing: the start is still at its door
    gated.gate.set()
    claim.join(60)

    agent._state.close()  # left open for the late start; the process's exit closes them
    agent._lock_file.close()

    [error] = gated.outcome
    assert isinstance(error, RuntimeFailure), error
    assert not procfs.pids_of_uids(range(uid_base, uid_base + 6))

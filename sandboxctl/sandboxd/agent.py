"""The agent: which sandboxes exist on this host, who holds them, and until when.

``Agent`` is the facade the HTTP API (``api.py``) and the CLI call; it keeps the
sandboxes' records under one lock and composes the parts that do the work:

- ``pools.py``: the warm pools and the refill loop;
- ``leases.py``: what a claim may ask for, and the reaper that ends leases;
- ``launcher.py``: starting and cleaning up one sandbox;
- ``adoption.py``: taking back what the last agent left (``recovery.py``: when its
  database cannot be read);
- ``uids.py``: each sandbox's host uid and the host-wide uid claims;
- ``homes.py``: where the sandboxes' homes are;
- ``attachments.py``: addresses and the calls to the sandbox network;
- ``tokens.py``, ``events.py``, ``usage.py``, ``deaths.py``.

Isolation itself is the runtime's job (``runtime.py``).
"""

from __future__ import annotations

import fcntl
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from sandboxctl.agentapi.models import AgentInfo, ClaimRequest, TemplateBuild
from sandboxctl.agentapi.network import NetworkUpdate
from sandboxctl.clock import Clock, SystemClock
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.ids import public_id
from sandboxctl.core.model import DEFAULT_NET, PoolKey
from sandboxctl.core.netpolicy import NetworkPolicy
from sandboxctl.core.templates import READY_TIMEOUT
from sandboxctl.lifecycle import Runnable, Stop
from sandboxctl.sandboxd import hostlimits
from sandboxctl.sandboxd.adoption import Adoption, AdoptionReport
from sandboxctl.sandboxd.attachments import Attachments
from sandboxctl.sandboxd.deaths import DeathWatch
from sandboxctl.sandboxd.errors import (
    AtCapacity,
    BadRequest,
    Conflict,
    NoSuchSandbox,
)
from sandboxctl.sandboxd.events import EventLog
from sandboxctl.sandboxd.homes import Homes
from sandboxctl.sandboxd.launcher import Launcher
from sandboxctl.sandboxd.launcher import identity as identity_of
from sandboxctl.sandboxd.leases import (
    Reaper,
    check_claim_terms,
    check_on_expire,
    is_due,
    lease_ttl,
)
from sandboxctl.sandboxd.network.sandboxes import SandboxNetwork
from sandboxctl.sandboxd.pools import WarmPools, check_pool_key, check_targets
from sandboxctl.sandboxd.runtime import Identity, Runtime, RuntimeFailure, SandboxSpec
from sandboxctl.sandboxd.runtimedir import STATE_LOCK, state_dir_in_use
from sandboxctl.sandboxd.state import STATE_FILE, SandboxRecord, StateCorrupt, StateStore
from sandboxctl.sandboxd.templates.catalog import Catalog, Served
from sandboxctl.sandboxd.tokens import EndedTokens, new_token
from sandboxctl.sandboxd.uids import SandboxUids, UidClaims
from sandboxctl.sandboxd.usage import DEFAULT_INTERVAL, DEFAULT_RING, UsageSampler

__all__ = ["AdoptionReport", "Agent", "AgentSettings"]

log = logging.getLogger("sandboxctl.sandboxd")

BASE_TEMPLATE = "base"
LOOP_STOP_TIMEOUT = 30.0  # how long a stop waits for loops and starts before it destroys anyway


@dataclass(frozen=True, slots=True)
class AgentSettings:
    node: str
    advertise_addr: str
    state_dir: Path
    templates: Mapping[str, Path] = field(default_factory=dict)  # "base" is always "/"
    # Every template built into this store is served too (sandboxd/templates/).
    template_store: Path | None = None
    host_root: bool = True  # serve the host's "/" as template "base"
    ready_timeout: float = READY_TIMEOUT  # for a template's ready command (startup.py)
    max_sandboxes: int = 64
    pools: Mapping[PoolKey, int] = field(default_factory=dict)
    uid_base: int = 200_000
    reap_interval: float = 1.0
    # What sandbox uids reach (RUNTIME_DIR/homes; see runtimedir.py); None: the state dir.
    runtime_dir: Path | None = None
    # Host-wide uid claims shared with the other agents of this host (see uids.py), held
    # by runtime_dir; None: uids are picked from uid_base up without asking anyone.
    uid_claims: Path | None = None
    # Usage samples of each claimed sandbox (usage.py): how often, and how many kept.
    usage_interval: float = DEFAULT_INTERVAL
    usage_ring: int = DEFAULT_RING


class Agent:
    """Thread-safe; the HTTP handlers call it from a thread pool."""

    def __init__(
        self,
        settings: AgentSettings,
        runtime: Runtime,
        clock: Clock | None = None,
        network: SandboxNetwork | None = None,
    ) -> None:
        """``network`` None: sandboxes get a network namespace with only ``lo`` and no
        policy is enforced (the unsafe-process runtime has no namespaces at all)."""
        self.settings = settings
        self.runtime = runtime
        self.network = network
        self.clock = clock or SystemClock()
        if BASE_TEMPLATE in settings.templates:
            raise BadRequest(f"template {BASE_TEMPLATE!r} is the host root and cannot be replaced")
        self.templates = Catalog(settings.templates, settings.template_store, settings.host_root)
        self._lock_file = _lock_state_dir(settings.state_dir)
        runtime_dir = settings.runtime_dir or settings.state_dir
        homes = Homes(runtime_dir, settings.state_dir)
        claims = UidClaims(settings.uid_claims, runtime_dir) if settings.uid_claims else None
        self._uids = SandboxUids(settings.uid_base, claims)
        try:
            self._state = StateStore(settings.state_dir / STATE_FILE)
        except StateCorrupt:
            self._lock_file.close()
            raise
        self._lock = threading.RLock()
        self._starts_ended = threading.Condition(self._lock)
        self._records: dict[str, SandboxRecord] = {}
        self._dead: list[SandboxRecord] = []  # forgotten under the lock, cleaned up off it
        self._ended_tokens = EndedTokens()
        self._stopping = Stop()  # the agent's work ends: its loops and a refill in progress
        self._stopped = False
        self._closed = False  # set by stop: what starts after it is not recorded
        self._loops: list[_AgentLoop] = []
        self._deaths = DeathWatch(self._died)  # watching from start()
        self.events = EventLog(now=self._now)
        self.usage = UsageSampler(
            self._claimed_specs, runtime, settings.usage_interval, settings.usage_ring, self._now
        )
        self._attachments = Attachments(network, settings.node)
        self._launcher = Launcher(
            runtime,
            self.templates,
            homes,
            self._attachments,
            self._uids,
            self._state,
            self.events,
            self._now,
            settings.ready_timeout,
        )
        self._adoption = Adoption(self._state, self._launcher, self._uids, homes, self._attachments)
        self.pools = WarmPools(self.refill_once)
        self._reaper = Reaper(
            self._due, self.hibernate, self._destroy, self.events, self._now, settings.reap_interval
        )
        self.set_pools(dict(settings.pools))

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> AdoptionReport:
        """Adopt what the last run left and size the host's shared kernel tables for this
        agent's sandboxes; the loops are :meth:`loops`, for the process manager to run."""
        report = self.adopt()
        if self.runtime.isolated:
            charged = self.runtime.limits_mode == "cgroup-v1"
            hostlimits.raise_tables(self.settings.max_sandboxes, hostlimits.tables(charged))
        self._deaths.start()
        self.pools.wanted.set()
        return report

    def loops(self) -> tuple[Runnable, ...]:
        """The refill, reaper and usage loops, as parts for the process manager (after
        :meth:`start`, in ``Group.OTHERS``): one that fails stops the process with its
        exit code. A stop of any of them stops the agent's work (a refill ends between
        two starts); the manager has stopped them all before :meth:`stop` destroys."""
        loops = (
            _AgentLoop("warm-pool refill", self.pools.run, self._stopping),
            _AgentLoop("lease reaper", self._reaper.run, self._stopping),
            _AgentLoop("usage sampler", self.usage.run, self._stopping),
        )
        self._loops.extend(loops)
        return loops

    def stop(self, destroy: bool = False) -> None:
        """Stop the agent's work; sandboxes keep running unless ``destroy``, and only once
        its loops have returned (under a manager they have; a loop that does not return is
        waited for a bounded time, then logged). Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._stopping.set()
        self._deaths.stop()
        deadline = time.monotonic() + LOOP_STOP_TIMEOUT

        def remaining() -> float:
            return max(0.0, deadline - time.monotonic())

        for loop in self._loops:
            if not loop.idle.wait(remaining()):
                log.error("%s did not stop within %ss", loop.name, LOOP_STOP_TIMEOUT)
        with self._lock:
            # A claim's start may outlive the server's grace: wait for it to be recorded.
            late = not self._starts_ended.wait_for(lambda: not self.pools.starting(), remaining())
            if late:
                log.error("sandbox starts did not end within %ss", LOOP_STOP_TIMEOUT)
            self._closed = True  # a start still running cleans up after itself
            ids = list(self._records)
        try:
            if destroy:
                for sandbox_id in ids:
                    try:
                        self._destroy(sandbox_id)
                    except Exception:
                        log.exception("could not destroy %s on exit", sandbox_id)
            self._attachments.stop(remove=destroy)
        finally:
            if not late:  # else a late start still needs them to clean up after itself
                self._state.close()
                self._lock_file.close()

    def adopt(self) -> AdoptionReport:
        return self._adoption.adopt(self._adopted, self._known)

    # --- reads -------------------------------------------------------------------------

    def info(self) -> AgentInfo:
        with self._lock:
            claimed = [r for r in self._records.values() if r.claimed]
            return AgentInfo(
                node=self.settings.node,
                advertise_addr=self.settings.advertise_addr,
                pools=self.pools.status(),
                claimed=len(claimed),
                hibernated=sum(1 for r in claimed if r.hibernated),
                capacity=self.settings.max_sandboxes,
                at_capacity=len(claimed) >= self.settings.max_sandboxes,
                runtime=self.runtime.name,
                limits=self.runtime.limits_mode,
                templates=tuple(sorted(self.templates)),
                template_builds=tuple(
                    _template_build(t) for t in self.templates.every() if t.build
                ),
            )

    def sandboxes(self, claim_ref: str | None = None) -> list[SandboxRecord]:
        with self._lock:
            return [
                r
                for r in self._records.values()
                if r.claimed and (claim_ref is None or r.claim_ref == claim_ref)
            ]

    def get(self, sandbox_id: str) -> SandboxRecord:
        with self._lock:
            record = self._records.get(sandbox_id)
            if record is None or not record.claimed:
                raise NoSuchSandbox(f"sandbox {sandbox_id!r} not found")
            return record

    def token_of(self, sandbox_id: str) -> str | None:
        """A claimed sandbox's token, or None for an unknown id; one that ended keeps
        its token for a while (``tokens.py``)."""
        with self._lock:
            record = self._records.get(sandbox_id)
            if record is not None and record.claimed:
                return record.token
            return self._ended_tokens.get(sandbox_id)

    def spec(self, record: SandboxRecord) -> SandboxSpec:
        return self._launcher.spec(record)

    def identity(self, record: SandboxRecord) -> Identity:
        return identity_of(record)

    # --- verbs -------------------------------------------------------------------------

    def claim(self, request: ClaimRequest) -> SandboxRecord:
        check_pool_key(request.key, self.templates)
        check_claim_terms(request)
        key = request.key.pool  # the claim's net is its policy, applied by _grant
        ttl = lease_ttl(request.ttl_seconds)
        uid: int | None = None
        while uid is None:
            with self._lock:
                sandbox_id = self._take_warm(key)
                if sandbox_id is not None:
                    return self._grant_warm(sandbox_id, request, ttl)
                evict = self._make_room()
                if evict is None:
                    uid = self._reserve(key)
            if evict is not None:
                self._destroy(evict)  # a speculative warm sandbox makes room for a claim
        try:
            record = self._launcher.start(key, uid)
        except BaseException:
            with self._lock:
                self._end_start(key)
            self._uids.release(uid)
            raise
        _log_created(record, "for a claim")
        with self._lock:
            self._end_start(key)
            closed = self._closed
            if not closed:
                try:
                    self._grant(record, request, ttl)  # claimed before it is indexed: never warm
                except RuntimeFailure:
                    self._dead.append(record)
                    self.pools.wanted.set()
                    raise
                self._add(record)
        if closed:  # its request outlived the server's grace
            self._discard_late(record)
            raise RuntimeFailure("the agent stopped while the sandbox started")
        return record

    def set_network(self, sandbox_id: str, update: NetworkUpdate) -> SandboxRecord:
        """Replace a claimed sandbox's egress rules; effective before this returns."""
        try:
            with self._lock:
                record = self.get(sandbox_id)
                changed = record.network.updated(update.internet, update.allow_out, update.deny_out)
        except InvalidValueError as error:
            raise BadRequest(str(error)) from None
        if self.network is None:
            raise BadRequest("network: this agent runs sandboxes without a network")
        with self._lock:
            self._attachments.apply(record, changed)
            record.network = changed
            record.net = "egress" if changed.internet else "none"
            self._state.put(record)
        return record

    def release(self, sandbox_id: str) -> None:
        self.get(sandbox_id)
        self.events.record(sandbox_id, "sandbox killed")
        if not self._destroy(sandbox_id):
            raise NoSuchSandbox(f"sandbox {sandbox_id!r} not found")
        log.info("sandbox %s killed", public_id(sandbox_id))

    def renew(self, sandbox_id: str, ttl_seconds: int, on_expire: str | None) -> SandboxRecord:
        if on_expire is not None:
            check_on_expire(on_expire)
        ttl = lease_ttl(ttl_seconds)
        with self._lock:
            record = self.get(sandbox_id)
            record.deadline = self._now() + ttl
            record.ttl_seconds = ttl
            if on_expire is not None:
                record.on_expire = on_expire
            self._state.put(record)
            return record

    def hibernate(self, sandbox_id: str) -> None:
        # The runtime call may take a while (the freezer settles): never under the lock.
        record = self.get(sandbox_id)
        if record.hibernated:
            raise Conflict(f"sandbox {sandbox_id!r} is already hibernated")
        self.runtime.freeze(self.spec(record), identity_of(record))
        with self._lock:
            record.hibernated = True
            self._state.put(record)
        self.events.record(sandbox_id, "sandbox paused")
        log.info("sandbox %s paused", public_id(sandbox_id))

    def wake(self, sandbox_id: str) -> None:
        record = self.get(sandbox_id)
        if not record.hibernated:
            raise Conflict(f"sandbox {sandbox_id!r} is not hibernated")
        self.runtime.thaw(self.spec(record), identity_of(record))
        with self._lock:
            record.hibernated = False
            now = self._now()
            if record.deadline is not None and record.deadline <= now:
                # Woken after it expired into a pause: give it a fresh lease, or the
                # reaper would pause it again at once.
                record.deadline = now + record.ttl_seconds
            self._state.put(record)
        self.events.record(sandbox_id, "sandbox resumed")
        log.info("sandbox %s resumed", public_id(sandbox_id))

    def set_pools(self, targets: Mapping[PoolKey, int]) -> None:
        """Replace every warm target; a pool left out drains to zero."""
        check_targets(targets, self.templates)
        with self._lock:
            self.pools.set_targets(targets)
        self._drain_excess()
        self.pools.wanted.set()

    def reap(self) -> list[tuple[str, str]]:
        """Act on every lease past its deadline; returns (id, "destroyed"|"paused")."""
        return self._reaper.reap()

    def refill_once(self) -> int:
        """Clean up what died, drain what exceeds the targets, then start what the pools
        lack, one sandbox at a time; returns how many started."""
        with self._lock:
            dead, self._dead = self._dead, []
        for record in dead:
            self._launcher.cleanup(record, None)
        self._drain_excess()
        started = 0
        while not self._stopping.is_set():
            with self._lock:
                key = self._next_refill()
                if key is None:
                    return started
                uid = self._reserve(key)
            try:
                record = self._launcher.start(key, uid)
            except Exception:
                log.exception("warm-pool refill of %s failed", key)
                with self._lock:
                    self._end_start(key)
                self._uids.release(uid)
                raise
            _log_created(record, "warm")
            with self._lock:
                self._end_start(key)
                closed = self._closed
                if not closed:
                    self._add(record)
            if closed:  # a loop that outlived the stop's wait
                self._discard_late(record)
                return started
            started += 1
        return started

    # --- internals (callers hold the lock where noted) -----------------------------------

    def _grant_warm(self, sandbox_id: str, request: ClaimRequest, ttl: int) -> SandboxRecord:
        """Under the lock: hand a warm sandbox to a claimant."""
        record = self._records[sandbox_id]
        try:
            self._grant(record, request, ttl)
        except RuntimeFailure:
            self._forget(sandbox_id)  # its policy could not be applied
            self._dead.append(record)
            raise
        finally:
            self.pools.wanted.set()
        return record

    def _grant(self, record: SandboxRecord, request: ClaimRequest, ttl: int) -> None:
        """Under the lock: hand a started sandbox to a claimant and persist it."""
        now = self._now()
        record.claimed = True
        record.token = new_token()
        record.claim_ref = request.claim_ref
        record.metadata = dict(request.metadata)
        record.env = dict(request.env or {})
        record.ttl_seconds = ttl
        record.deadline = now + ttl
        record.claimed_at = now
        record.on_expire = request.on_expire
        chosen = request.network or NetworkPolicy(internet=request.net == "egress")
        self._attachments.apply(record, chosen)
        record.network = chosen
        record.net = "egress" if chosen.internet else DEFAULT_NET
        self._state.put(record)
        self.events.record(record.id, "sandbox claimed", claim_ref=request.claim_ref or record.id)
        log.info("sandbox %s claimed by %s", public_id(record.id), request.claim_ref or "a client")
        self.usage.poke()

    def _take_warm(self, key: PoolKey) -> str | None:
        """Under the lock: the oldest warm sandbox of this key that still runs. Dead ones
        are forgotten here and cleaned up by the refill loop, off the lock."""
        while (sandbox_id := self.pools.pop_oldest(key)) is not None:
            record = self._records[sandbox_id]
            if self.runtime.alive(identity_of(record)):
                return sandbox_id
            log.warning("warm sandbox %s died; discarding it", sandbox_id)
            self._forget(sandbox_id)
            self._dead.append(record)
            self.pools.wanted.set()
        return None

    def _make_room(self) -> str | None:
        """Under the lock: a warm sandbox of another pool to give up so a cold claim fits,
        or None when there is room. Raises AtCapacity when every slot is claimed."""
        if self._live() < self.settings.max_sandboxes:
            return None
        victim = self.pools.pop_any()
        if victim is None:
            raise AtCapacity(f"node {self.settings.node} is at capacity")
        return victim

    def _next_refill(self) -> PoolKey | None:
        """Under the lock: the pool furthest below its target, if there is room."""
        if self._live() >= self.settings.max_sandboxes:
            return None
        return self.pools.next_refill()

    def _live(self) -> int:
        """Under the lock: sandboxes running or starting."""
        return len(self._records) + self.pools.starting()

    def _reserve(self, key: PoolKey) -> int:
        """Under the lock: count a start in progress and pick a host uid for it."""
        self.pools.begin_start(key)
        return self._uids.reserve()

    def _drain_excess(self) -> None:
        with self._lock:
            excess = self.pools.pop_excess()
        for sandbox_id in excess:
            self._destroy(sandbox_id)

    def _add(self, record: SandboxRecord) -> None:
        """Under the lock."""
        self._records[record.id] = record
        self._deaths.watch(record.id, identity_of(record))
        self._uids.use(record.uid)
        self._attachments.use_address(record.address)
        if not record.claimed:
            self.pools.add(record.key.pool, record.id)

    def _forget(self, sandbox_id: str) -> SandboxRecord | None:
        """Under the lock."""
        record = self._records.pop(sandbox_id, None)
        if record is not None:
            self._deaths.forget(sandbox_id)
            if record.claimed:
                self._ended_tokens.add(sandbox_id, record.token)
            self.pools.discard(record.key.pool, sandbox_id)
        return record

    def _adopted(self, record: SandboxRecord) -> None:
        with self._lock:
            self._add(record)

    def _known(self) -> list[SandboxRecord]:
        with self._lock:
            return list(self._records.values())

    def _claimed_specs(self) -> list[tuple[SandboxSpec, Identity]]:
        with self._lock:
            return [(self.spec(r), identity_of(r)) for r in self._records.values() if r.claimed]

    def _due(self, now: float) -> list[SandboxRecord]:
        with self._lock:
            return [r for r in self._records.values() if is_due(r, now)]

    def _died(self, sandbox_id: str) -> None:
        """The death watch saw this sandbox's init exit: forget it now (reads answer 404,
        envd "not found"), clean it up in the refill loop, off the watch's thread."""
        with self._lock:
            record = self._records.get(sandbox_id)
            if record is None or self.runtime.alive(identity_of(record)):
                return
            self._forget(sandbox_id)
            self._dead.append(record)
        state = f"claimed by {record.claim_ref or 'a client'}" if record.claimed else "warm"
        log.warning("sandbox %s (%s) died: its init exited; cleaning it up", sandbox_id, state)
        self.pools.wanted.set()

    def _destroy(self, sandbox_id: str) -> bool:
        """Destroy one sandbox; False if another caller got there first."""
        with self._lock:
            record = self._forget(sandbox_id)
        if record is None:
            return False
        self._launcher.cleanup(record, identity_of(record))
        self.pools.wanted.set()
        return True

    def _end_start(self, key: PoolKey) -> None:
        """Under the lock."""
        self.pools.end_start(key)
        self._starts_ended.notify_all()

    def _discard_late(self, record: SandboxRecord) -> None:
        """Destroy a sandbox whose start ended after :meth:`stop` took the list of
        sandboxes: nobody would destroy or adopt one the agent never recorded."""
        try:
            self._launcher.cleanup(record, identity_of(record))
        except Exception:
            log.exception("could not destroy %s, started after the stop", record.id)

    def _now(self) -> float:
        return self.clock.now().timestamp()


def _log_created(record: SandboxRecord, purpose: str) -> None:
    """The lifecycle lines name a sandbox as the SDK does (``sb-…``), so a user can grep
    the log for the id the SDK printed."""
    template = record.key.template
    log.info("sandbox %s created (%s, template %s)", public_id(record.id), purpose, template)


def _lock_state_dir(state_dir: Path) -> IO[str]:
    """One agent per state directory: a second one would adopt, and maybe destroy,
    sandboxes the first still serves. The lock is held while the returned file is open."""
    state_dir.mkdir(parents=True, exist_ok=True)
    lock_file = (state_dir / STATE_LOCK).open("w")
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock_file.close()
        raise state_dir_in_use(state_dir) from None
    return lock_file


def _template_build(template: Served) -> TemplateBuild:
    assert template.build is not None
    build = template.build
    return TemplateBuild(
        template=template.name,
        digest=build.digest,
        created_at=datetime.fromtimestamp(build.created_at, UTC),
        size_bytes=build.size_bytes,
        suite=build.suite,
        packages=build.packages,
        run=build.run,
        build_seconds=build.build_seconds,
        start_cmd=template.start_cmd,
        ready_cmd=template.ready_cmd,
    )


class _AgentLoop:
    """One of the agent's loops as a runnable: it runs until the manager's stop or the
    agent's, and the manager's stop is the agent's too."""

    def __init__(self, name: str, loop: Callable[[Stop], None], agent_stopping: Stop) -> None:
        self.name = name
        self._loop = loop
        self._agent_stopping = agent_stopping
        self.idle = threading.Event()  # not running: never started, or returned
        self.idle.set()

    def run(self, stop: Stop) -> None:
        self.idle.clear()
        try:
            stop.on_set(self._agent_stopping.set)
            self._loop(self._agent_stopping)
        finally:
            self.idle.set()

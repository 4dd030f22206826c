"""The agent: which sandboxes exist on this host, who holds them, and until when.

It owns the warm pools (pre-started sandboxes per pool key, refilled in the background),
the leases (a reaper destroys or pauses each claimed sandbox at its deadline), and the
state on disk that lets a restarted agent adopt every sandbox that still runs. Isolation
itself is the runtime's job (``runtime.py``).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import secrets
import shutil
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sandboxctl.agentapi.models import AgentInfo, ClaimRequest, PoolStatus, TemplateBuild
from sandboxctl.agentapi.network import NetworkUpdate
from sandboxctl.clock import Clock, SystemClock
from sandboxctl.core.envvars import check_env
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.model import DEFAULT_NET, NETS, PoolKey
from sandboxctl.core.netpolicy import NetworkPolicy
from sandboxctl.core.templates import READY_TIMEOUT
from sandboxctl.sandboxd import hostlimits, procfs
from sandboxctl.sandboxd.bubblewrap import kill_uid
from sandboxctl.sandboxd.deaths import DeathWatch
from sandboxctl.sandboxd.errors import (
    AtCapacity,
    BadRequest,
    Conflict,
    NoSuchSandbox,
    StateDirInUse,
    UnknownTemplate,
)
from sandboxctl.sandboxd.events import EventLog
from sandboxctl.sandboxd.network.sandboxes import Attachment, SandboxNetwork
from sandboxctl.sandboxd.runtime import (
    SIZE_LIMITS,
    Identity,
    Runtime,
    RuntimeFailure,
    SandboxSpec,
    Size,
)
from sandboxctl.sandboxd.runtimedir import HOMES
from sandboxctl.sandboxd.state import STATE_FILE, SandboxRecord, StateCorrupt, StateStore
from sandboxctl.sandboxd.templates.catalog import Catalog, Served
from sandboxctl.sandboxd.templates.startup import start_template
from sandboxctl.sandboxd.uids import UidClaims
from sandboxctl.sandboxd.usage import DEFAULT_INTERVAL, DEFAULT_RING, UsageSampler

log = logging.getLogger("sandboxctl.sandboxd")

ON_EXPIRE = ("destroy", "pause")
DEFAULT_TTL_SECONDS = 300
MAX_TTL_SECONDS = 24 * 3600
MAX_METADATA_PAIRS = 16
MAX_METADATA_BYTES = 4096
BASE_TEMPLATE = "base"
REFILL_RETRY_SECONDS = 1.0
HOME_FILES = (".passwd", ".group", ".passwd.tmp", ".group.tmp")  # next to each home
ORPHAN_KILL_TIMEOUT = 10.0
ENDED_TOKENS = 4096  # tokens of claimed sandboxes that ended, kept for their holders


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
        self._addresses: set[str] = set()  # sandbox addresses in use or being started
        self.clock = clock or SystemClock()
        if BASE_TEMPLATE in settings.templates:
            raise BadRequest(f"template {BASE_TEMPLATE!r} is the host root and cannot be replaced")
        self.templates = Catalog(settings.templates, settings.template_store, settings.host_root)
        self._lock_state_dir(settings.state_dir)
        runtime_dir = settings.runtime_dir or settings.state_dir
        self._homes = runtime_dir / HOMES
        self._homes.mkdir(parents=True, exist_ok=True)
        self._homes.chmod(0o711)  # sandbox uids must traverse to their own home
        # Where an agent from before runtime dirs kept homes; adopted sandboxes keep theirs.
        self._old_homes = settings.state_dir / HOMES if runtime_dir != settings.state_dir else None
        self._in_old_homes: set[str] = set()
        self._claims = UidClaims(settings.uid_claims, runtime_dir) if settings.uid_claims else None
        try:
            self._state = StateStore(settings.state_dir / STATE_FILE)
        except StateCorrupt:
            self._lock_file.close()
            raise
        self._lock = threading.RLock()
        self._records: dict[str, SandboxRecord] = {}
        self._warm: dict[PoolKey, list[str]] = {}
        self._starting: dict[PoolKey, int] = {}
        self._uids_in_use: set[int] = set()
        self._skipped_uids: set[int] = set()  # taken by others when last tried (logged)
        self._targets: dict[PoolKey, int] = {}
        self._dead: list[SandboxRecord] = []  # forgotten under the lock, cleaned up off it
        self._refill_wanted = threading.Event()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._deaths = DeathWatch(self._died)  # watching from start()
        self._ended_tokens: OrderedDict[str, str] = OrderedDict()  # of claimed ones gone
        self.events = EventLog(now=self._now)
        self.usage = UsageSampler(
            self._claimed_specs, runtime, settings.usage_interval, settings.usage_ring, self._now
        )
        self.set_pools(dict(settings.pools))

    def _lock_state_dir(self, state_dir: Path) -> None:
        """One agent per state directory: a second one would adopt, and maybe destroy,
        sandboxes the first still serves."""
        state_dir.mkdir(parents=True, exist_ok=True)
        self._lock_file = (state_dir / "sandboxd.lock").open("w")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise StateDirInUse(
                f"--state-dir {state_dir} is in use by another running agent"
            ) from None

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> AdoptionReport:
        """Adopt what the last run left, size the host's shared kernel tables for this
        agent's sandboxes, then start the refill and reaper loops."""
        report = self.adopt()
        if self.runtime.isolated:
            charged = self.runtime.limits_mode == "cgroup-v1"
            hostlimits.raise_tables(self.settings.max_sandboxes, hostlimits.tables(charged))
        self._deaths.start()
        for name, loop in (
            ("warm-pool refill", self._refill_loop),
            ("lease reaper", self._reap_loop),
            ("usage sampler", lambda: self.usage.run(self._stopping)),
        ):
            thread = threading.Thread(target=_guarded(name, loop), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        self._refill_wanted.set()
        return report

    def stop(self, destroy: bool = False) -> None:
        """Stop the loops; sandboxes keep running unless ``destroy``. Idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._deaths.stop()
        self._refill_wanted.set()
        self.usage.poke()
        for thread in self._threads:
            thread.join(timeout=30)
        try:
            if destroy:
                with self._lock:
                    ids = list(self._records)
                for sandbox_id in ids:
                    try:
                        self._destroy(sandbox_id)
                    except Exception:
                        log.exception("could not destroy %s on exit", sandbox_id)
            if self.network is not None:
                self.network.stop(remove=destroy)
        finally:
            self._state.close()
            self._lock_file.close()

    def adopt(self) -> AdoptionReport:
        adopted: list[str] = []
        cleaned: list[str] = []
        records = self._state.sandboxes()
        if self._old_homes is not None and self._old_homes.is_dir():
            self._in_old_homes = {
                r.id for r in records if (self._old_homes / f"{r.id}.passwd").exists()
            }
        for record in records:
            identity = Identity(record.pid, record.start_time, record.pid_namespace)
            if self.runtime.alive(identity):
                self._claim_adopted(record)
                with self._lock:
                    self._add(record)
                adopted.append(record.id)
            elif self._uid_held_elsewhere(record.uid):
                # A row from before uid claims whose uid another agent has taken since:
                # destroying would kill that agent's sandbox. Its own processes are gone.
                log.warning(
                    "dead sandbox %s: its uid %d is another agent's now; forgetting it",
                    record.id,
                    record.uid,
                )
                self._remove_home(record.id)
                self._state.delete(record.id)
                cleaned.append(record.id)
            else:
                self._cleanup(record, None)
                cleaned.append(record.id)
        if adopted or cleaned:
            log.info("adopted %d sandboxes, cleaned up %d dead ones", len(adopted), len(cleaned))
        if self.network is not None:  # re-attach each one's network, drop what others left
            with self._lock:
                attached = [_attachment(r) for r in self._records.values() if r.address]
            self.network.start(attached)
        self._clean_leftovers()
        return AdoptionReport(tuple(adopted), tuple(cleaned))

    def _claim_adopted(self, record: SandboxRecord) -> None:
        if self._claims is not None and not self._claims.take(record.uid, running=True):
            log.warning(
                "adopted sandbox %s runs as uid %d, which another agent claims",
                record.id,
                record.uid,
            )

    def _uid_held_elsewhere(self, uid: int) -> bool:
        if self._claims is None:
            return False
        holder = self._claims.holder_of(uid)
        return holder is not None and holder != self._claims.holder and holder.is_dir()

    def _clean_leftovers(self) -> None:
        """What a start cut short (the agent killed before the sandbox's row was written)
        left: homes of no sandbox, and uids this agent claims for none, whose processes
        are killed. An emptied homes dir of an older agent goes too."""
        with self._lock:
            keep = set(self._records)
            uids = {record.uid for record in self._records.values()} | self._uids_in_use
        for directory in (self._homes, self._old_homes):
            if directory is not None and directory.is_dir():
                for entry in directory.iterdir():
                    if _sandbox_of(entry.name) not in keep:
                        _remove(entry)
        if self._old_homes is not None and self._old_homes.is_dir():
            with contextlib.suppress(OSError):  # not empty: sandboxes adopted from there
                self._old_homes.rmdir()
        if self._claims is not None:
            for uid in self._claims.held() - uids:
                try:
                    kill_uid(uid, ORPHAN_KILL_TIMEOUT)
                except RuntimeFailure as error:  # the claim stays: tried again next start
                    log.warning("uid %d of no sandbox: %s", uid, error)
                else:
                    self._claims.drop(uid)
                    log.info("freed uid %d: claimed by this agent for no sandbox it knows", uid)

    # --- reads -------------------------------------------------------------------------

    def info(self) -> AgentInfo:
        with self._lock:
            keys = sorted(set(self._targets) | {k for k, ids in self._warm.items() if ids})
            claimed = [r for r in self._records.values() if r.claimed]
            return AgentInfo(
                node=self.settings.node,
                advertise_addr=self.settings.advertise_addr,
                pools=tuple(
                    PoolStatus(
                        key=key,
                        warm=len(self._warm.get(key, ())),
                        target=self._targets.get(key, 0),
                        refilling=self._starting.get(key, 0),
                    )
                    for key in keys
                ),
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
        """A claimed sandbox's token, or None for an unknown id. A claimed sandbox that
        ended (released, expired, died) keeps its token here for a while, so its holder
        learns that it is gone (404, envd's "not found") rather than that the token is
        wrong (401)."""
        with self._lock:
            record = self._records.get(sandbox_id)
            if record is not None and record.claimed:
                return record.token
            return self._ended_tokens.get(sandbox_id)

    def spec(self, record: SandboxRecord) -> SandboxSpec:
        return SandboxSpec(
            id=record.id,
            uid=record.uid,
            root=self.templates.get(record.template, Path("/")),
            home=self._home(record.id),
            limits=SIZE_LIMITS[Size(record.size)],
            hostname=record.id.replace("_", "-"),
            env=record.env,
            resolv_conf=self.network.resolv_conf if self.network is not None else None,
        )

    def _claimed_specs(self) -> list[tuple[SandboxSpec, Identity]]:
        with self._lock:
            return [(self.spec(r), self.identity(r)) for r in self._records.values() if r.claimed]

    def identity(self, record: SandboxRecord) -> Identity:
        return Identity(record.pid, record.start_time, record.pid_namespace)

    def _home(self, sandbox_id: str) -> Path:
        if self._old_homes is not None and sandbox_id in self._in_old_homes:
            return self._old_homes / sandbox_id
        return self._homes / sandbox_id

    def _remove_home(self, sandbox_id: str) -> None:
        home = self._home(sandbox_id)
        for entry in (home, *(home.with_name(home.name + suffix) for suffix in HOME_FILES)):
            _remove(entry)
        self._in_old_homes.discard(sandbox_id)

    # --- verbs -------------------------------------------------------------------------

    def claim(self, request: ClaimRequest) -> SandboxRecord:
        claimed = self._check_claim(request)
        key = claimed.pool  # the claim's net is its policy, applied by _grant
        ttl = _ttl(request.ttl_seconds) or DEFAULT_TTL_SECONDS
        uid: int | None = None
        while uid is None:
            with self._lock:
                sandbox_id = self._take_warm(key)
                if sandbox_id is not None:
                    record = self._records[sandbox_id]
                    try:
                        self._grant(record, request, ttl)
                    except RuntimeFailure:
                        self._forget(sandbox_id)  # its policy could not be applied
                        self._dead.append(record)
                        raise
                    finally:
                        self._refill_wanted.set()
                    return record
                evict = self._make_room()
                if evict is None:
                    uid = self._reserve(key)
            if evict is not None:
                self._destroy(evict)  # a speculative warm sandbox makes room for a claim
        try:
            record = self._start_sandbox(key, uid)
        except BaseException:
            self._free_uid(uid)
            raise
        finally:
            with self._lock:
                self._starting[key] -= 1
        with self._lock:
            try:
                self._grant(record, request, ttl)  # claimed before it is indexed: never warm
            except RuntimeFailure:
                self._dead.append(record)
                self._refill_wanted.set()
                raise
            self._add(record)
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
            self.network.apply(_attachment(record, changed))
            record.network = changed
            record.net = "egress" if changed.internet else "none"
            self._state.put(record)
        return record

    def release(self, sandbox_id: str) -> None:
        self.get(sandbox_id)
        self.events.record(sandbox_id, "sandbox killed")
        if not self._destroy(sandbox_id):
            raise NoSuchSandbox(f"sandbox {sandbox_id!r} not found")

    def renew(self, sandbox_id: str, ttl_seconds: int, on_expire: str | None) -> SandboxRecord:
        if on_expire is not None and on_expire not in ON_EXPIRE:
            raise BadRequest(f"on_expire: must be one of {', '.join(ON_EXPIRE)}")
        ttl = _ttl(ttl_seconds) or DEFAULT_TTL_SECONDS
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
        self.runtime.freeze(self.spec(record), self.identity(record))
        with self._lock:
            record.hibernated = True
            self._state.put(record)
        self.events.record(sandbox_id, "sandbox paused")

    def wake(self, sandbox_id: str) -> None:
        record = self.get(sandbox_id)
        if not record.hibernated:
            raise Conflict(f"sandbox {sandbox_id!r} is not hibernated")
        self.runtime.thaw(self.spec(record), self.identity(record))
        with self._lock:
            record.hibernated = False
            now = self._now()
            if record.deadline is not None and record.deadline <= now:
                # Woken after it expired into a pause: give it a fresh lease, or the
                # reaper would pause it again at once.
                record.deadline = now + record.ttl_seconds
            self._state.put(record)
        self.events.record(sandbox_id, "sandbox resumed")

    def set_pools(self, targets: Mapping[PoolKey, int]) -> None:
        """Replace every warm target; a pool left out drains to zero."""
        for key, target in targets.items():
            self._check_key(key)
            if key.net != DEFAULT_NET:
                raise BadRequest(
                    f"pools: {key}: net is not a pool dimension: every warm sandbox serves "
                    "either net (the claim applies it); drop it"
                )
            if target < 0:
                raise BadRequest(f"pools: warm for {key} must not be negative")
        with self._lock:
            self._targets = {k: n for k, n in targets.items() if n > 0}
        for sandbox_id in self._excess_warm():
            self._destroy(sandbox_id)
        self._refill_wanted.set()

    def _excess_warm(self) -> list[str]:
        """Take out the warm sandboxes beyond each pool's target (adopted ones included)."""
        drain: list[str] = []
        with self._lock:
            for key, ids in self._warm.items():
                excess = len(ids) - self._targets.get(key, 0)
                for _ in range(max(0, excess)):
                    drain.append(ids.pop())
        return drain

    def reap(self) -> list[tuple[str, str]]:
        """Act on every lease past its deadline; returns (id, "destroyed"|"paused")."""
        now = self._now()
        done: list[tuple[str, str]] = []
        with self._lock:
            due = [
                r
                for r in self._records.values()
                if r.claimed and r.deadline is not None and r.deadline <= now
            ]
        for record in due:
            if record.on_expire == "pause":
                if not record.hibernated:
                    with contextlib.suppress(Conflict, NoSuchSandbox):
                        self.hibernate(record.id)
                        done.append((record.id, "paused"))
            elif self._destroy(record.id):
                done.append((record.id, "destroyed"))
        for sandbox_id, action in done:
            log.info("lease of %s expired: %s", sandbox_id, action)
            self.events.record(sandbox_id, f"sandbox timed out: {action}", action=action)
        return done

    def refill_once(self) -> int:
        """Clean up what died, drain what exceeds the targets, then start what the pools
        lack, one sandbox at a time; returns how many started."""
        with self._lock:
            dead, self._dead = self._dead, []
        for record in dead:
            self._cleanup(record, None)
        for sandbox_id in self._excess_warm():
            self._destroy(sandbox_id)
        started = 0
        while not self._stopping.is_set():
            with self._lock:
                key = self._next_refill()
                if key is None:
                    return started
                uid = self._reserve(key)
            try:
                record = self._start_sandbox(key, uid)
            except Exception:
                log.exception("warm-pool refill of %s failed", key)
                with self._lock:
                    self._starting[key] -= 1
                self._free_uid(uid)
                raise
            with self._lock:
                self._starting[key] -= 1
                self._add(record)
            started += 1
        return started

    # --- internals (callers hold the lock where noted) -----------------------------------

    def _check_claim(self, request: ClaimRequest) -> PoolKey:
        key = request.key
        self._check_key(key)
        _ttl(request.ttl_seconds)
        if request.on_expire not in ON_EXPIRE:
            raise BadRequest(f"on_expire: must be one of {', '.join(ON_EXPIRE)}")
        if len(request.metadata) > MAX_METADATA_PAIRS:
            raise BadRequest(f"metadata: at most {MAX_METADATA_PAIRS} pairs")
        encoded = sum(len(k.encode()) + len(v.encode()) for k, v in request.metadata.items())
        if encoded > MAX_METADATA_BYTES:
            raise BadRequest(f"metadata: at most {MAX_METADATA_BYTES} bytes")
        namespace, slash, name = request.claim_ref.partition("/")
        if request.claim_ref and (not slash or not namespace or not name or "/" in name):
            raise BadRequest("claim_ref: expected <namespace>/<name>")
        _check_env(request.env or {})
        return key

    def _check_key(self, key: PoolKey) -> None:
        if key.template not in self.templates:
            raise UnknownTemplate(f"template {key.template!r} is not served by this node")
        if key.net not in NETS:
            raise BadRequest(f"net: must be one of {', '.join(NETS)}")
        if key.size not in {s.value for s in Size}:
            raise BadRequest(f"size: must be one of {', '.join(s.value for s in Size)}")

    def _take_warm(self, key: PoolKey) -> str | None:
        """Under the lock: the oldest warm sandbox of this key that still runs. Dead ones
        are forgotten here and cleaned up by the refill loop, off the lock."""
        ids = self._warm.get(key, [])
        while ids:
            sandbox_id = ids.pop(0)
            record = self._records[sandbox_id]
            if self.runtime.alive(self.identity(record)):
                return sandbox_id
            log.warning("warm sandbox %s died; discarding it", sandbox_id)
            self._forget(sandbox_id)
            self._dead.append(record)
            self._refill_wanted.set()
        return None

    def _make_room(self) -> str | None:
        """Under the lock: a warm sandbox of another pool to give up so a cold claim fits,
        or None when there is room. Raises AtCapacity when every slot is claimed."""
        live = len(self._records) + sum(self._starting.values())
        if live < self.settings.max_sandboxes:
            return None
        for ids in self._warm.values():
            if ids:
                victim = ids.pop()
                return victim
        raise AtCapacity(f"node {self.settings.node} is at capacity")

    def _reserve(self, key: PoolKey) -> int:
        """Under the lock: count a start in progress and pick a host uid for it: the
        lowest from uid_base up that this agent does not use, that no process runs as
        and, with uid claims, that no other agent claims."""
        self._starting[key] = self._starting.get(key, 0) + 1
        uid = self.settings.uid_base
        while uid in self._uids_in_use or not self._uid_free(uid):
            uid += 1
        self._uids_in_use.add(uid)
        return uid

    def _uid_free(self, uid: int) -> bool:
        """Under the lock: claim ``uid`` (with uid claims), or see that no process runs
        as it; a uid found taken is logged once and skipped."""
        claims = self._claims
        free = claims.take(uid) if claims is not None else not procfs.pids_of_uid(uid)
        if not free and uid not in self._skipped_uids:
            self._skipped_uids.add(uid)
            log.warning(
                "uid %d is taken (another agent claims it, or a process runs as it): skipping it",
                uid,
            )
        return free

    def _free_uid(self, uid: int) -> None:
        """A uid no sandbox of this agent has any more (destroyed, or never started)."""
        if self._claims is not None:
            self._claims.drop(uid)
        with self._lock:
            self._uids_in_use.discard(uid)

    def _next_refill(self) -> PoolKey | None:
        """Under the lock: the pool furthest below its target, if there is room."""
        live = len(self._records) + sum(self._starting.values())
        if live >= self.settings.max_sandboxes:
            return None
        lacking = [
            (len(self._warm.get(k, ())) + self._starting.get(k, 0) - target, k)
            for k, target in self._targets.items()
        ]
        lacking = [item for item in lacking if item[0] < 0]
        return min(lacking)[1] if lacking else None

    def _start_sandbox(self, key: PoolKey, uid: int) -> SandboxRecord:
        sandbox_id = "sb_" + secrets.token_hex(6)
        address = self._take_address()
        record = SandboxRecord(
            id=sandbox_id,
            token="",
            template=key.template,
            net=DEFAULT_NET,
            size=key.size,
            uid=uid,
            pid=0,
            start_time=0,
            pid_namespace=0,
            claimed=False,
            claim_ref="",
            metadata={},
            ttl_seconds=0,
            deadline=None,
            claimed_at=None,
            on_expire="destroy",
            hibernated=False,
            created_at=self._now(),
            address=address,
        )
        try:
            template = self.templates.served(key.template)
            if template is None:  # removed from the store since the claim was checked
                raise UnknownTemplate(f"template {key.template!r} is not served by this node")
            spec = replace(self.spec(record), root=template.root)
            identity = self.runtime.start(spec)
            if self.network is not None:
                try:
                    self.network.attach(_attachment(record, pid=identity.pid))
                except BaseException:
                    self.runtime.destroy(self.spec(record), identity)
                    raise
            if template.start_cmd or template.ready_cmd:
                self._start_template(record, spec, identity, template)
        except BaseException:
            with self._lock:
                self._addresses.discard(address)
            raise
        record.pid = identity.pid
        record.start_time = identity.start_time
        record.pid_namespace = identity.pid_namespace
        self._state.put(record)
        self.events.record(sandbox_id, "sandbox created", template=key.template)
        return record

    def _start_template(
        self, record: SandboxRecord, spec: SandboxSpec, identity: Identity, template: Served
    ) -> None:
        """Its start command, then wait for its ready command; a sandbox that never gets
        ready is destroyed (RuntimeFailure: the claim's 503, the refill's retry)."""
        try:
            start_template(
                self.runtime, spec, identity, template, self.events, self.settings.ready_timeout
            )
        except BaseException:
            if self.network is not None:
                self.network.detach(record.id, record.address)
            self.runtime.destroy(spec, identity)
            self.events.gone(record.id)
            raise

    def _grant(self, record: SandboxRecord, request: ClaimRequest, ttl: int) -> None:
        """Under the lock: hand a started sandbox to a claimant and persist it."""
        now = self._now()
        record.claimed = True
        record.token = secrets.token_urlsafe(24)
        record.claim_ref = request.claim_ref
        record.metadata = dict(request.metadata)
        record.env = dict(request.env or {})
        record.ttl_seconds = ttl
        record.deadline = now + ttl
        record.claimed_at = now
        record.on_expire = request.on_expire
        chosen = request.network or NetworkPolicy(internet=request.net == "egress")
        if self.network is not None:
            self.network.apply(_attachment(record, chosen))
        record.network = chosen
        record.net = "egress" if chosen.internet else DEFAULT_NET
        self._state.put(record)
        self.events.record(record.id, "sandbox claimed", claim_ref=request.claim_ref or record.id)
        self.usage.poke()

    def _add(self, record: SandboxRecord) -> None:
        self._records[record.id] = record
        self._deaths.watch(record.id, self.identity(record))
        self._uids_in_use.add(record.uid)
        if record.address:
            self._addresses.add(record.address)
        if not record.claimed:
            self._warm.setdefault(record.key.pool, []).append(record.id)

    def _forget(self, sandbox_id: str) -> SandboxRecord | None:
        record = self._records.pop(sandbox_id, None)
        if record is not None:
            self._deaths.forget(sandbox_id)
            if record.claimed:
                self._ended_tokens[sandbox_id] = record.token
                while len(self._ended_tokens) > ENDED_TOKENS:
                    self._ended_tokens.popitem(last=False)
            ids = self._warm.get(record.key.pool, [])
            if sandbox_id in ids:
                ids.remove(sandbox_id)
        return record

    def _died(self, sandbox_id: str) -> None:
        """The death watch saw this sandbox's init exit: forget it now (reads answer 404,
        envd "not found"), clean it up in the refill loop, off the watch's thread."""
        with self._lock:
            record = self._records.get(sandbox_id)
            if record is None or self.runtime.alive(self.identity(record)):
                return
            self._forget(sandbox_id)
            self._dead.append(record)
        state = f"claimed by {record.claim_ref or 'a client'}" if record.claimed else "warm"
        log.warning("sandbox %s (%s) died: its init exited; cleaning it up", sandbox_id, state)
        self._refill_wanted.set()

    def _destroy(self, sandbox_id: str) -> bool:
        """Destroy one sandbox; False if another caller got there first."""
        with self._lock:
            record = self._forget(sandbox_id)
        if record is None:
            return False
        self._cleanup(record, self.identity(record))
        self._refill_wanted.set()
        return True

    def _cleanup(self, record: SandboxRecord, identity: Identity | None) -> None:
        # Kill first, forget on disk second: a crash in between leaves a row whose
        # sandbox is dead, which the next start cleans up. A failed destroy keeps the row
        # and the uid, so the sandbox is retried at the next start instead of leaking.
        self.runtime.destroy(self.spec(record), identity)
        if self.network is not None:
            self.network.detach(record.id, record.address)
        self._state.delete(record.id)
        self.events.gone(record.id)
        self._in_old_homes.discard(record.id)
        self._free_uid(record.uid)
        with self._lock:
            self._addresses.discard(record.address)

    def _take_address(self) -> str:
        """The lowest free sandbox address of the subnet ("" without a network)."""
        if self.network is None:
            return ""
        subnet = self.network.subnet
        with self._lock:
            for index in range(subnet.capacity):
                address = subnet.address(index)
                if address not in self._addresses:
                    self._addresses.add(address)
                    return address
        raise AtCapacity(f"node {self.settings.node}: no free address in {subnet}")

    def _now(self) -> float:
        return self.clock.now().timestamp()

    def _refill_loop(self) -> None:
        while not self._stopping.is_set():
            self._refill_wanted.wait()
            self._refill_wanted.clear()
            try:
                self.refill_once()
            except Exception:
                # Already logged; try again later instead of spinning on a broken start.
                self._stopping.wait(REFILL_RETRY_SECONDS)
                self._refill_wanted.set()

    def _reap_loop(self) -> None:
        while not self._stopping.wait(self.settings.reap_interval):
            self.reap()


@dataclass(frozen=True, slots=True)
class AdoptionReport:
    adopted: tuple[str, ...]
    cleaned: tuple[str, ...]


def _attachment(
    record: SandboxRecord, policy: NetworkPolicy | None = None, pid: int | None = None
) -> Attachment:
    return Attachment(
        record.id,
        record.pid if pid is None else pid,
        record.address,
        record.network if policy is None else policy,
    )


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


def _ttl(ttl_seconds: int) -> int:
    if ttl_seconds < 0:
        raise BadRequest("ttl_seconds: must not be negative")
    return min(ttl_seconds, MAX_TTL_SECONDS)


def _check_env(env: Mapping[str, str]) -> None:
    try:
        check_env(env)
    except InvalidValueError as error:
        raise BadRequest(str(error)) from None


def _sandbox_of(name: str) -> str:
    """The sandbox a homes-dir entry belongs to: ``ID``, ``ID.passwd``, ``ID.group``..."""
    return name.split(".", 1)[0]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)  # fd-based: symlinks inside are not followed
    else:
        path.unlink(missing_ok=True)


def _guarded(name: str, loop: Any) -> Any:
    def run() -> None:
        try:
            loop()
        except Exception:
            log.exception("%s crashed", name)
            raise

    return run

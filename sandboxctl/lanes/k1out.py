"""K1OUT-01: a control-plane outage of four windows changes nothing a reader sees
(no stamp moves, so no node ages), a claim still lands, and the lease holder stays up
(stricter than exiting on "leader election lost", which a replica could do and pass).

Two fresh sandboxes on each host; the control plane is stopped for 4 x stale_after.
Both replicas are polled throughout (their health, their lists: every claimed sandbox,
so every node, listed) and the envd proxy's health; one publish interval before the end
replica 2 (replicas[1]) gets an e2b create, judged by its HTTP status. The control plane
is started again after. That replica 1 (replicas[0]) held the lease is read from its log
(the lease's last word before the outage: "is the leader").

K1OUT-02 is the same outage one layer down: etcd stops under a running kube-apiserver,
which keeps answering (watches open, writes and reads that need etcd failing), instead
of vanishing. It runs on a kit that can stop etcd: the local kit on the real control
plane (the API double has no etcd)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import httpx

from sandboxctl.lanes import observe
from sandboxctl.lanes.kit import Kit, Replica
from sandboxctl.lanes.model import LOCAL, Lane, LaneError, Progress, Verdict, Windows

FRESH = 2  # per host
WINDOWS_DOWN = 4
CREATED = 201
# What sandboxctl.kube.lease logs as it wins and loses the lease.
LEADS = "is the leader"
STOPPED_LEADING = "stops leading"

LANE = Lane(
    id="K1OUT-01",
    group="K1OUT",
    proves="with the control plane down for four windows every node stays listed on both "
    "replicas, a claim lands, and the warm-pool lease holder keeps serving",
    needs=frozenset({"stop_control_plane", "start_control_plane", "replica_log"}),
)


ETCD_LANE = Lane(
    id="K1OUT-02",
    group="K1OUT",
    proves="with etcd down under a running kube-apiserver for four windows every node stays "
    "listed on both replicas, a claim lands, and the warm-pool lease holder keeps serving",
    kits=frozenset({LOCAL}),  # an external kit's file names no command for etcd: no needs
)


@runtime_checkable
class StoreOutages(Protocol):
    """A kit that can stop the control plane's store under its API server."""

    def etcd_problem(self) -> str | None:
        """Why this kit cannot stop etcd now (one line that says what to do), or None."""
        ...

    def stop_etcd(self) -> None: ...

    def start_etcd(self) -> None: ...


def outage(windows: Windows) -> float:
    return WINDOWS_DOWN * windows.stale_after


@dataclass
class Poll:
    at: float  # seconds since the control plane stopped
    up: dict[str, bool]  # replica -> its health checks answered
    proxy: bool
    listed: dict[str, tuple[int, int, int] | None]  # replica -> (claimed seen, B, all)


@dataclass
class Claim:
    at: float
    status: int | None  # None: no answer
    node: str
    detail: str = ""


@dataclass
class Observed:
    claimed: int  # the sandboxes claimed on both hosts before the outage
    lease_holder: str
    led: bool = True  # the holder's log says it leads, before the outage
    stopped_leading: bool = False  # its log says it stopped leading, during the outage
    polls: list[Poll] = field(default_factory=list)
    claim: Claim | None = None
    down_for: float = 0.0


def timeline(observed: Observed, windows: Windows) -> str:
    """The polls nearest each half publish past a whole one, and the claim, in time
    order."""
    rows: list[tuple[float, str]] = []
    marks = [windows.publish * (k + 0.5) for k in range(int(observed.down_for / windows.publish))]
    nearest = {
        id(poll): poll
        for mark in marks
        if observed.polls
        for poll in [min(observed.polls, key=lambda p: abs(p.at - mark))]
    }
    for poll in nearest.values():
        cells = [("up" if up else "down") for up in poll.up.values()]
        cells.append("up" if poll.proxy else "down")
        for counts in poll.listed.values():
            cells.append("-" if counts is None else f"{counts[1]} / {counts[2]}")
        rows.append((poll.at, f"{poll.at:.1f} s | " + " | ".join(cells) + " |"))
    claim = observed.claim
    if claim is not None:
        answer = "no answer" if claim.status is None else f"HTTP {claim.status}"
        where = f", clientID {claim.node}" if claim.node else ""
        rows.append((claim.at, f"{claim.at:.1f} s | claim on replica 2 -> {answer}{where}"))
    header = "t | " + " | ".join(_columns(observed)) + " |"
    return "\n".join([header, *(text for _, text in sorted(rows, key=lambda row: row[0]))])


def _columns(observed: Observed) -> list[str]:
    if not observed.polls:
        return []
    first = observed.polls[0]
    return [*first.up, "proxy", *(f"{name} lists B / all" for name in first.listed)]


def judge(observed: Observed, windows: Windows, lane: Lane = LANE) -> Verdict:
    polls, holder = observed.polls, observed.lease_holder
    claimed = _claim_text(observed.claim)
    figure = (
        f"outage {observed.down_for:.1f} s; every node listed on both replicas in "
        f"{len(_listed_all(observed))} of {len(polls)} polls; {claimed}; lease holder "
        f"{holder} up in {len(_holder_up(observed))} of {len(polls)}"
        + (" (it stopped leading and kept serving)" if observed.stopped_leading else "")
    )
    bound = (
        f"outage >= {outage(windows):.1f} s ({WINDOWS_DOWN} windows); every poll: all "
        f"{observed.claimed} claimed sandboxes listed on both, every replica and the proxy "
        f"up; claim HTTP {CREATED}"
    )
    problems = [problem for check in _CHECKS if (problem := check(observed, windows)) is not None]
    detail = "; ".join(problems)
    table = timeline(observed, windows)
    return Verdict(lane.id, not problems, figure, bound, f"{detail}\n{table}" if detail else table)


def _listed_all(observed: Observed) -> list[Poll]:
    """The polls in which both replicas listed every claimed sandbox."""
    return [
        p
        for p in observed.polls
        if all(c is not None and c[0] == observed.claimed for c in p.listed.values())
    ]


def _holder_up(observed: Observed) -> list[Poll]:
    return [p for p in observed.polls if p.up.get(observed.lease_holder)]


def _claim_text(claim: Claim | None) -> str:
    if claim is None:
        return "no claim made"
    if claim.status is None:
        return f"claim on replica 2 at t = {claim.at:.1f} s: no answer"
    return f"claim on replica 2 at t = {claim.at:.1f} s -> HTTP {claim.status}"


# --- what fails the lane, in the order the verdict says it: each a problem or None -----


def _no_polls(observed: Observed, windows: Windows) -> str | None:
    return None if observed.polls else "no poll was made"


def _outage_too_short(observed: Observed, windows: Windows) -> str | None:
    if observed.down_for >= outage(windows):
        return None
    return f"the outage lasted only {observed.down_for:.1f} s"


def _first_unlisted(observed: Observed, windows: Windows) -> str | None:
    listed_all = _listed_all(observed)
    missed = [p for p in observed.polls if p not in listed_all]
    if not missed:
        return None
    seen = ", ".join(
        f"{name}: {'no answer' if c is None else f'{c[0]}/{observed.claimed}'}"
        for name, c in missed[0].listed.items()
    )
    return f"at t = {missed[0].at:.1f} s listed {seen}"


def _holder_did_not_lead(observed: Observed, windows: Windows) -> str | None:
    if observed.led:
        return None
    return f"{observed.lease_holder} did not lead before the outage: it holds no lease to lose"


def _holder_down(observed: Observed, windows: Windows) -> str | None:
    holder = observed.lease_holder
    down = next((p for p in observed.polls if not p.up.get(holder)), None)
    return None if down is None else f"the lease holder {holder} was down at t = {down.at:.1f} s"


def _other_down(observed: Observed, windows: Windows) -> str | None:
    holder, polls = observed.lease_holder, observed.polls
    others = [(p, name) for p in polls for name, up in p.up.items() if name != holder and not up]
    others += [(p, "the proxy") for p in polls if not p.proxy]
    if not others:
        return None
    poll, name = others[0]
    return f"{name} was down at t = {poll.at:.1f} s"


def _claim_failed(observed: Observed, windows: Windows) -> str | None:
    claim = observed.claim
    if claim is not None and claim.status == CREATED:
        return None
    detail = f" ({claim.detail})" if claim and claim.detail else ""
    return _claim_text(claim) + detail


_CHECKS: tuple[Callable[[Observed, Windows], str | None], ...] = (
    _no_polls,
    _outage_too_short,
    _first_unlisted,
    _holder_did_not_lead,
    _holder_down,
    _other_down,
    _claim_failed,
)


class ControlPlaneOutage(observe.MeasuredLane[Observed]):
    """K1OUT-01: kube-apiserver (all of the control plane a reader sees) goes away."""

    lanes: tuple[Lane, ...] = (LANE,)
    down = "control plane"  # what the progress says is down

    def judged(self, observed: Observed, kit: Kit, progress: Progress) -> Verdict:
        for line in timeline(observed, kit.windows).splitlines():
            progress.note(line)
        return judge(observed, kit.windows, self.lanes[0])

    def stop(self, kit: Kit) -> None:
        kit.stop_control_plane()

    def start(self, kit: Kit) -> None:
        kit.start_control_plane()

    def measure(self, clients: observe.Clients, progress: Progress) -> Observed:
        kit = clients.kit
        clock, windows = self._clock, kit.windows
        holder, other = kit.replicas[0], kit.replicas[1]
        grants = {
            kit.a.label: observe.claim_fresh(kit, kit.a, "k1out-a", FRESH),
            kit.b.label: {},
        }
        created: str | None = None
        stopped = False
        try:
            grants[kit.b.label] = observe.claim_fresh(kit, kit.b, "k1out-b", FRESH)
            names = frozenset(grants[kit.a.label]) | frozenset(grants[kit.b.label])
            observe.wait_listed(clients, progress, "the fresh sandboxes on both hosts", names)
            before = kit.replica_log(holder)
            observed = Observed(len(names), holder.name, led=_leads(before))
            progress.note(f"{self.down} down for {outage(windows):.0f} s")
            stopped = True
            self.stop(kit)
            start = clock()
            claim_at = start + outage(windows) - windows.publish

            def poll() -> None:
                at = clock() - start
                up = {r.name: observe.healthy(clients, r) for r in kit.replicas}
                listed: dict[str, tuple[int, int, int] | None] = {}
                for r in kit.replicas:
                    found = observe.try_listed(clients, r)
                    listed[r.name] = (
                        None
                        if found is None
                        else (
                            len(names & set(found)),
                            len(observe.on_node(found, kit.b.node)),
                            len(found),
                        )
                    )
                observed.polls.append(Poll(at, up, observe.proxy_up(clients), listed))
                nonlocal created
                if observed.claim is None and clock() >= claim_at:
                    observed.claim, created = _claim(clients, other, clock() - start)

            observe.observe(progress, "the outage", clock, start + outage(windows), poll)
            observed.down_for = clock() - start
            observed.stopped_leading = STOPPED_LEADING in kit.replica_log(holder)[len(before) :]
            self.start(kit)
            stopped = False
            progress.wait_for(
                "B's inventory readable again",
                lambda: observe.try_inventory(kit, kit.b) is not None,
                windows.publish + 10,
            )
            return observed
        finally:
            if stopped:
                self.start(kit)
            if created is not None:
                clients.e2b(other).delete(f"/sandboxes/{created}")
            observe.release(kit, kit.a, grants[kit.a.label])
            observe.release(kit, kit.b, grants[kit.b.label])


def _claim(clients: observe.Clients, replica: Replica, at: float) -> tuple[Claim, str | None]:
    body = {"templateID": clients.kit.template, "timeout": observe.CLAIM_TTL}
    try:
        answer = clients.e2b(replica).post("/sandboxes", json=body, timeout=15)
    except httpx.HTTPError as error:
        return Claim(at, None, "", str(error) or type(error).__name__), None
    try:
        reply = answer.json()
    except ValueError:
        reply = {}
    if not isinstance(reply, dict):
        reply = {}
    node = str(reply.get("clientID") or "")
    created = str(reply["sandboxID"]) if answer.status_code == CREATED else None
    detail = "" if answer.status_code == CREATED else answer.text[:200]
    return Claim(at, answer.status_code, node, detail), created


def _leads(log: str) -> bool:
    """Whether the last leadership line a replica logged says it leads."""
    said = [line for line in log.splitlines() if LEADS in line or STOPPED_LEADING in line]
    return bool(said) and LEADS in said[-1]


class StoreOutage(ControlPlaneOutage):
    """K1OUT-02: etcd goes away under a kube-apiserver that stays up."""

    lanes: tuple[Lane, ...] = (ETCD_LANE,)
    down = "etcd (kube-apiserver up on it)"

    def run(self, kit: Kit, selected: frozenset[str], progress: Progress) -> Iterable[Verdict]:
        # Refused before any sandbox is claimed for it.
        problem = _store(kit).etcd_problem()
        if problem is not None and ETCD_LANE.id in selected:
            raise LaneError(problem)
        return super().run(kit, selected, progress)

    def stop(self, kit: Kit) -> None:
        _store(kit).stop_etcd()

    def start(self, kit: Kit) -> None:
        _store(kit).start_etcd()


def _store(kit: Kit) -> StoreOutages:
    if isinstance(kit, StoreOutages):
        return kit
    raise LaneError(f"the {kit.name} kit cannot stop etcd")


SCENARIO = ControlPlaneOutage()
ETCD_SCENARIO = StoreOutage()

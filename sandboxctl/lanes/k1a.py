"""K1A-01 to K1A-09: lane (a) of the K1 kit (docs/lanes.md), a dead host.

Seven fresh sandboxes are claimed on B at the start (never ones left from an earlier
run, whose state could pass a lane by chance). Before the kill: both APIs of both
replicas list them (01), and 30 e2b creates land over both hosts and give the latency
baseline (02). Then B's agent and publisher get ``kill -9`` with a watch open on each
replica: B's sandboxes leave every list within the window measured from B's last publish
(03), each watch sends DELETED for each of them after its opening burst (04); after the
window an e2b GET and DELETE of a B sandbox answer 404 (05), 30 creates never land on B
and are as fast as before (06), the envd proxy probes for 20 unknown ids and answers 502
(07), and nftables counts no packet toward B's agent after the window and a margin (08).
B's restart brings its inventory back on its next publish, with the sandboxes the agent
kept (09).

Claims and creates are judged by their HTTP status; watch events count only after the
opening burst. Every bound derives from the kit's windows.
"""

from __future__ import annotations

import contextlib
import secrets
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from sandboxctl.core.ids import SandboxId
from sandboxctl.core.timestamps import parse_rfc3339
from sandboxctl.lanes import observe
from sandboxctl.lanes.kit import Kit, Replica
from sandboxctl.lanes.model import Lane, LaneError, LaneTimeout, Progress, Verdict, Windows
from sandboxctl.proxy.app import ENVD_PORT

FRESH = 7  # sandboxes claimed on B for this lane
CREATES = 30
UNKNOWN_IDS = 20
CREATE_TIMEOUT = 60  # seconds an e2b-created sandbox lives (they are deleted at once)
# publishedAt has whole seconds: a publish at t is stamped floor(t).
PRECISION = 1.0
# What a read adds to a change: the replica's informer delivering the live host's publish,
# the API answering, our 0.1 s poll, and a publisher's interval drifting by its own
# apply time on a loaded machine.
READ_SLACK = 1.0
# K1A-08: after B leaves the lists, a request already under way (a warm-pool driver tick,
# a claim that sampled B just before) may still reach B. The reference allowed 2 s; this
# is one driver tick (1 s on the local kit) plus the read slack, and does not scale with
# the windows because neither does what it covers.
MARGIN = 2.0
# K1A-06: the creates after the kill "match the baseline": p50 within twice the
# baseline's plus a quarter second, since two runs of 30 cold starts on a shared 2-core
# machine differ by that much with nothing wrong; a stall (a claim waiting on B) costs a
# connect timeout, seconds.
P50_FACTOR = 2.0
P50_ALLOWANCE = 0.25
STALL = 5.0

KILL = frozenset({"kill_host", "start_host"})


def _lane(number: int, proves: str, needs: frozenset[str] = frozenset()) -> Lane:
    return Lane(id=f"K1A-{number:02d}", group="K1A", proves=proves, needs=needs)


LANES = (
    _lane(1, "seven sandboxes freshly claimed on B are listed by the e2b API and the Sandbox "
          "API of every replica"),
    _lane(2, "before the kill, 30 e2b creates all succeed, over both hosts; their p50 is "
          "the latency baseline"),
    _lane(3, "after kill -9 of B's agent and publisher, B's sandboxes leave every list "
          "between the stale window and the window plus one publish after B's last "
          "publish", KILL),
    _lane(4, "a Sandbox API watch open across the kill sends DELETED for each of B's "
          "sandboxes after its opening burst", KILL),
    _lane(5, "after the window an e2b GET and DELETE of a B sandbox both answer 404", KILL),
    _lane(6, "after the window 30 e2b creates never land on B, none stalls, and their p50 "
          "matches the baseline", KILL),
    _lane(7, "after the window the envd proxy probes for each of 20 unknown ids and "
          "answers 502, without asking B", KILL),
    _lane(8, "nftables on B counts no packet toward B's agent once the window and a margin "
          "have passed", KILL | {"packets_to_agent"}),
    _lane(9, "restarted, B is listed again on its next publish with the sandboxes its "
          "agent kept", KILL),
)  # fmt: skip
LANE_IDS = tuple(lane.id for lane in LANES)
AFTER_KILL = frozenset(LANE_IDS[2:])


def leave_bound(windows: Windows) -> tuple[float, float]:
    """When B's sandboxes may leave the lists, in seconds after B's last stamp.

    A node is dropped once a live node's stamp trails it by more than ``stale_after``,
    so never before ``stale_after``. The reference advances only with A's publishes,
    every ``publish`` seconds, and stamps are whole seconds, so the first stamp of A past
    the window comes at most ``publish`` plus ``PRECISION`` after it; the lists show it
    within ``READ_SLACK``. At production's 30 s / 90 s this is [90 s, 122 s] (a run on
    hardware measured 120.8 s); at the local kit's 3 s / 9 s, [9 s, 14 s]."""
    return windows.stale_after, windows.stale_after + windows.publish + PRECISION + READ_SLACK


def return_bound(windows: Windows) -> float:
    """Seconds from B's restart (agent and publisher answering) until it is listed again:
    its publisher's first publish comes within one interval, then the read slack."""
    return windows.publish + 2 * READ_SLACK


# --- what the scenario observes --------------------------------------------------------


@dataclass
class Create:
    status: int
    seconds: float
    node: str = ""  # the e2b clientID
    sandbox: str = ""  # the e2b sandboxID


@dataclass
class Observed:
    fresh: dict[str, str] = field(default_factory=dict)  # namespace/name -> e2b sandboxID
    views_listing: dict[str, int] = field(default_factory=dict)  # view -> fresh listed (01)
    baseline: list[Create] = field(default_factory=list)  # 02
    last_publish: float | None = None  # B's last stamp (unix seconds)
    left: dict[str, float] = field(default_factory=dict)  # view -> unix time it dropped B
    views: tuple[str, ...] = ()  # every view the lists were read through
    deleted: dict[str, int] = field(default_factory=dict)  # replica -> DELETEDs of fresh
    watch_failure: str = ""
    after_window: dict[str, int] = field(default_factory=dict)  # "GET replica-0" -> status
    creates_after: list[Create] = field(default_factory=list)  # 06
    proxy_statuses: list[int] = field(default_factory=list)  # 07
    probes: int | None = None  # the proxy's probes during 07
    packets_during_probes: int | None = None
    packets_by_margin: int | None = None  # since the kill, up to the window + MARGIN
    packets_after_margin: int | None = None
    watched_after_margin: float = 0.0  # seconds the counter was read over after the margin
    returned_after: float | None = None  # 09: seconds from the restart to listed again
    returned_views: int = 0


# --- judgments (pure) ------------------------------------------------------------------


def judge_listed(observed: Observed) -> Verdict:
    views = observed.views_listing
    complete = [view for view, count in views.items() if count == FRESH]
    figure = f"{FRESH} fresh B sandboxes listed by {len(complete)} of {len(views)} views"
    missing = [f"{view} {count}/{FRESH}" for view, count in views.items() if count != FRESH]
    detail = "short: " + ", ".join(missing) if missing else ""
    return Verdict(
        "K1A-01",
        bool(views) and not missing,
        figure,
        f"{FRESH}/{FRESH} in every view (e2b and Sandbox API of each replica)",
        detail,
    )


def judge_baseline(observed: Observed) -> Verdict:
    creates = observed.baseline
    ok = [c for c in creates if c.status == 201]
    nodes = sorted({c.node for c in ok})
    p50 = _p50(ok)
    figure = f"{len(ok)}/{len(creates)} created (HTTP 201) on {', '.join(nodes) or 'no node'}"
    figure += f"; p50 {p50:.3f} s" if p50 is not None else ""
    problems = []
    if len(ok) != CREATES or len(creates) != CREATES:
        bad = sorted({c.status for c in creates if c.status != 201})
        problems.append(f"{CREATES - len(ok)} not created (HTTP {bad})")
    if len(nodes) < 2:
        problems.append("the creates did not spread over both hosts")
    return Verdict(
        "K1A-02", not problems, figure, f"{CREATES}/{CREATES} HTTP 201 over both hosts",
        "; ".join(problems),
    )  # fmt: skip


def judge_left(observed: Observed, windows: Windows) -> Verdict:
    low, high = leave_bound(windows)
    bound = f"[{low:.1f} s, {high:.1f} s]"
    if observed.last_publish is None:
        return Verdict("K1A-03", False, "B's last publish unknown", bound, "no publishedAt on B")
    missing = [view for view in observed.views if view not in observed.left]
    if missing or not observed.left:
        waited = f"{high + 5:.1f}"
        return Verdict(
            "K1A-03", False, f"still listed {waited} s after B's last publish", bound,
            "B's sandboxes stayed in: " + ", ".join(missing),
        )  # fmt: skip
    first = min(observed.left.values()) - observed.last_publish
    last = max(observed.left.values()) - observed.last_publish
    figure = f"left {last:.1f} s after B's last publish"
    if first < last - 0.05:
        figure += f" (first view {first:.1f} s)"
    problems = []
    if first < low:
        problems.append(f"a view dropped B {first:.1f} s after its last publish, inside the window")
    if last > high:
        problems.append(f"the last view dropped B only {last:.1f} s after its last publish")
    return Verdict("K1A-03", not problems, figure, bound, "; ".join(problems))


def judge_deleted(observed: Observed) -> Verdict:
    counts = observed.deleted
    figure = ", ".join(f"{name} {count}/{FRESH}" for name, count in counts.items())
    figure = f"DELETED after the opening burst: {figure or 'no watch'}"
    problems = [f"{name} sent {count}/{FRESH}" for name, count in counts.items() if count != FRESH]
    if observed.watch_failure:
        problems.append(f"a watch failed: {observed.watch_failure}")
    return Verdict(
        "K1A-04", bool(counts) and not problems, figure,
        f"{FRESH}/{FRESH} on every replica's watch", "; ".join(problems),
    )  # fmt: skip


def judge_gone(observed: Observed) -> Verdict:
    statuses = observed.after_window
    figure = ", ".join(f"{what} {status}" for what, status in statuses.items())
    wrong = [what for what, status in statuses.items() if status != 404]
    return Verdict(
        "K1A-05", bool(statuses) and not wrong, figure or "no request made", "every answer 404",
        ("not 404: " + ", ".join(wrong)) if wrong else "",
    )  # fmt: skip


def judge_creates_after(observed: Observed, b_node: str) -> Verdict:
    creates = observed.creates_after
    baseline = _p50([c for c in observed.baseline if c.status == 201])
    ok = [c for c in creates if c.status == 201]
    p50 = _p50(ok)
    slowest = max((c.seconds for c in creates), default=0.0)
    on_b = [c for c in ok if c.node == b_node]
    stall = _stall(observed.baseline)
    figure = f"{len(ok)}/{len(creates)} created, {len(on_b)} on B"
    if p50 is not None:
        figure += f"; p50 {p50:.3f} s, slowest {slowest:.2f} s"
    bound = f"{CREATES}/{CREATES}, 0 on B, none over {stall:.1f} s"
    limit = None
    if baseline is not None:
        limit = baseline * P50_FACTOR + P50_ALLOWANCE
        bound += f", p50 at most {limit:.3f} s (baseline {baseline:.3f} s)"
    problems = []
    if len(ok) != CREATES:
        problems.append(f"{CREATES - len(ok)} not created")
    if on_b:
        problems.append(f"{len(on_b)} landed on B")
    if slowest > stall:
        problems.append(f"a create stalled {slowest:.2f} s")
    if limit is None:
        problems.append("no baseline (K1A-02 created nothing)")
    elif p50 is None or p50 > limit:
        problems.append("p50 above the baseline's bound")
    return Verdict("K1A-06", not problems, figure, bound, "; ".join(problems))


def judge_probes(observed: Observed) -> Verdict:
    statuses = observed.proxy_statuses
    answered = sum(status == 502 for status in statuses)
    figure = f"{answered}/{UNKNOWN_IDS} answered 502, {observed.probes} probes, "
    figure += f"{observed.packets_during_probes} packets toward B"
    problems = []
    if answered != UNKNOWN_IDS:
        problems.append(f"answers {sorted(set(statuses))}")
    if observed.probes != UNKNOWN_IDS:
        problems.append(f"the proxy probed {observed.probes} times, not once per unknown id")
    if observed.packets_during_probes != 0:
        problems.append("B was asked")
    return Verdict(
        "K1A-07", not problems, figure,
        f"{UNKNOWN_IDS}/{UNKNOWN_IDS} 502, {UNKNOWN_IDS} probes, 0 packets toward B",
        "; ".join(problems),
    )  # fmt: skip


def judge_packets(observed: Observed) -> Verdict:
    before, after = observed.packets_by_margin, observed.packets_after_margin
    bound = f"0 after the window + {MARGIN:.0f} s"
    if before is None or after is None:
        return Verdict("K1A-08", False, "not counted", bound, "the window never ended")
    figure = (
        f"{before} packets before the window + {MARGIN:.0f} s, {after} after "
        f"(over {observed.watched_after_margin:.1f} s)"
    )
    return Verdict("K1A-08", after == 0, figure, bound, "" if after == 0 else "B was asked")


def judge_returned(observed: Observed, windows: Windows) -> Verdict:
    bound = return_bound(windows)
    views = len(observed.views)
    if observed.returned_after is None:
        return Verdict(
            "K1A-09", False, f"not listed again within {bound + 5:.1f} s", f"{bound:.1f} s",
            f"{observed.returned_views} of {views} views list B's sandboxes",
        )  # fmt: skip
    figure = (
        f"listed again {observed.returned_after:.1f} s after B's restart, {FRESH}/{FRESH} "
        f"kept sandboxes in {views} views"
    )
    passed = observed.returned_after <= bound
    return Verdict(
        "K1A-09", passed, figure, f"{bound:.1f} s (a publish and the read slack)",
        "" if passed else "B came back later than its next publish",
    )  # fmt: skip


def _p50(creates: list[Create]) -> float | None:
    return statistics.median(c.seconds for c in creates) if creates else None


def _stall(baseline: list[Create]) -> float:
    slowest = max((c.seconds for c in baseline if c.status == 201), default=0.0)
    return max(STALL, 2 * slowest)


# --- the scenario ----------------------------------------------------------------------


class DeadHost:
    """The actions of lane (a); ``clock`` is wall time (B's stamps are)."""

    lanes: tuple[Lane, ...] = LANES

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock

    def run(self, kit: Kit, selected: frozenset[str], progress: Progress) -> Iterable[Verdict]:
        observed = Observed()
        b = kit.b
        grants = observe.claim_fresh(kit, b, "k1a", FRESH)
        observed.fresh = {ref: SandboxId.of_claim(grant.id).public for ref, grant in grants.items()}
        killed = False
        try:
            with observe.Clients(kit) as clients:  # the views' clients, kept across polls
                observed.views = tuple(self._views(kit))
                self._listed_before(clients, observed, progress)
                if "K1A-01" in selected:
                    yield judge_listed(observed)
                if selected & {"K1A-02", "K1A-06"}:
                    observed.baseline = self._creates(kit, progress, "before the kill")
                if "K1A-02" in selected:
                    yield judge_baseline(observed)
                if not selected & AFTER_KILL:
                    return
                killed = True
                yield from self._after_kill(clients, selected, progress, observed)
                killed = False
        finally:
            if killed:  # B stays dead only when a lane raised: bring it back for the rest
                kit.start_host(b)
            observe.release(kit, b, grants)

    def _after_kill(
        self,
        clients: observe.Clients,
        selected: frozenset[str],
        progress: Progress,
        observed: Observed,
    ) -> Iterator[Verdict]:
        kit = clients.kit
        b, windows = kit.b, kit.windows
        high = leave_bound(windows)[1]
        seconds = high + 4 * windows.publish + 30
        with observe.watching_all(kit, progress, time.monotonic, seconds) as watches:
            packets_at_kill = kit.packets_to_agent(b)
            progress.note(f"kill -9 of B's agent and publisher ({b.node})")
            kit.kill_host(b)
            stamp = observe.stamp_of(observe.try_inventory(kit, b))
            observed.last_publish = parse_rfc3339(stamp).timestamp() if stamp else None
            deadline = (observed.last_publish or self._clock()) + high + 5
            with contextlib.suppress(LaneTimeout):  # judged: which views kept B
                progress.wait_for(
                    "B's sandboxes to leave every list",
                    lambda: self._left(clients, observed),
                    max(0.0, deadline - self._clock()),
                )
            everywhere = len(observed.left) == len(observed.views)
            left = max(observed.left.values()) if everywhere else None
            if "K1A-03" in selected:
                yield judge_left(observed, windows)
            if left is None:
                raise LaneError(
                    "B's sandboxes never left the lists: nothing after the window can be judged"
                )
            # Read on time: the lanes after the window start only once it is read.
            progress.wait_for(
                f"the window + {MARGIN:.0f} s",
                lambda: self._clock() >= left + MARGIN or None,
                max(0.0, left + MARGIN - self._clock()) + 5,
            )
            by_margin = kit.packets_to_agent(b)
            margin_at = self._clock()
            observed.packets_by_margin = by_margin - packets_at_kill
            fresh = set(observed.fresh)
            with contextlib.suppress(LaneTimeout):  # judged: the counts say which fell short
                progress.wait_for(
                    "DELETED for each of B's sandboxes on every watch",
                    lambda: all(fresh <= w.deleted() for w in watches.values()),
                    observe.WATCH_TICK + 2 * READ_SLACK,
                )
            for name, watch in watches.items():
                observed.deleted[name] = len(fresh & watch.deleted())
                observed.watch_failure = observed.watch_failure or watch.failed
        if "K1A-04" in selected:
            yield judge_deleted(observed)
        if selected & {"K1A-05", "K1A-08"}:
            self._gone(kit, observed)
        if "K1A-05" in selected:
            yield judge_gone(observed)
        if "K1A-06" in selected:
            observed.creates_after = self._creates(kit, progress, "after the window")
            yield judge_creates_after(observed, b.node)
        if selected & {"K1A-07", "K1A-08"}:
            self._probes(kit, observed)
        if "K1A-07" in selected:
            yield judge_probes(observed)
        observed.packets_after_margin = kit.packets_to_agent(b) - by_margin
        observed.watched_after_margin = self._clock() - margin_at
        if "K1A-08" in selected:
            yield judge_packets(observed)
        progress.note(f"restarting B ({b.node})")
        kit.start_host(b)
        restarted = self._clock()
        try:
            progress.wait_for(
                "B's kept sandboxes in every list again",
                lambda: self._returned(clients, observed),
                return_bound(windows) + 5,
            )
            observed.returned_after = self._clock() - restarted
        except LaneTimeout:
            pass
        if "K1A-09" in selected:
            yield judge_returned(observed, windows)

    # --- reads -----------------------------------------------------------------------

    def _views(self, kit: Kit) -> Iterator[str]:
        for replica in kit.replicas:
            yield f"{replica.name} kube"
            yield f"{replica.name} e2b"

    def _fresh_listed(
        self, clients: observe.Clients, replica: Replica, api: str, observed: Observed
    ) -> int | None:
        """How many of the fresh sandboxes one view lists; None when it does not answer."""
        try:
            if api == "kube":
                names = set(observe.listed(clients, replica))
                return len(names & set(observed.fresh))
            ids = set(observe.e2b_listed(clients, replica))
            return len(ids & set(observed.fresh.values()))
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    def _counts(self, clients: observe.Clients, observed: Observed) -> dict[str, int | None]:
        return {
            f"{replica.name} {api}": self._fresh_listed(clients, replica, api, observed)
            for replica in clients.kit.replicas
            for api in ("kube", "e2b")
        }

    def _listed_before(
        self, clients: observe.Clients, observed: Observed, progress: Progress
    ) -> None:
        def complete() -> bool:
            counts = self._counts(clients, observed)
            observed.views_listing = {view: count or 0 for view, count in counts.items()}
            return all(count == FRESH for count in counts.values())

        # Lists lag by up to one publish; the fresh claims show on B's next one.
        with contextlib.suppress(LaneTimeout):  # judged: the counts say which fell short
            progress.wait_for(
                f"every list to show B's {FRESH} fresh sandboxes",
                complete,
                2 * clients.kit.windows.publish + 5,
            )

    def _left(self, clients: observe.Clients, observed: Observed) -> bool:
        now = self._clock()
        for view, count in self._counts(clients, observed).items():
            if count == 0 and view not in observed.left:
                observed.left[view] = now
        return len(observed.left) == len(observed.views)

    def _returned(self, clients: observe.Clients, observed: Observed) -> bool:
        counts = self._counts(clients, observed)
        observed.returned_views = sum(count == FRESH for count in counts.values())
        return observed.returned_views == len(counts)

    # --- actions ---------------------------------------------------------------------

    def _creates(self, kit: Kit, progress: Progress, when: str) -> list[Create]:
        """30 e2b creates, alternating over the replicas, then deleted again."""
        creates: list[Create] = []
        progress.note(f"{CREATES} e2b creates {when}")
        clients = [kit.e2b(replica) for replica in kit.replicas]
        try:
            for i in range(CREATES):
                client = clients[i % len(clients)]
                started = time.monotonic()
                try:
                    answer = client.post(
                        "/sandboxes", json={"templateID": kit.template, "timeout": CREATE_TIMEOUT}
                    )
                except httpx.HTTPError:
                    creates.append(Create(0, time.monotonic() - started))
                    continue
                seconds = time.monotonic() - started
                body: dict[str, Any] = answer.json() if answer.status_code == 201 else {}
                creates.append(
                    Create(
                        answer.status_code,
                        seconds,
                        str(body.get("clientID", "")),
                        str(body.get("sandboxID", "")),
                    )
                )
            for create in creates:
                if create.sandbox:
                    clients[0].delete(f"/sandboxes/{create.sandbox}")
        finally:
            for client in clients:
                client.close()
        return creates

    def _gone(self, kit: Kit, observed: Observed) -> None:
        sandbox = next(iter(observed.fresh.values()))
        for replica in kit.replicas:
            with kit.e2b(replica) as client:
                observed.after_window[f"GET {replica.name}"] = client.get(
                    f"/sandboxes/{sandbox}"
                ).status_code
        with kit.e2b(kit.replicas[-1]) as client:
            observed.after_window[f"DELETE {kit.replicas[-1].name}"] = client.delete(
                f"/sandboxes/{sandbox}"
            ).status_code

    def _probes(self, kit: Kit, observed: Observed) -> None:
        before_packets = kit.packets_to_agent(kit.b)
        with kit.proxy() as client:
            before = _probes(client)
            for _ in range(UNKNOWN_IDS):
                unknown = f"sb-{secrets.token_hex(6)}"
                answer = client.get(
                    "/health", headers={"Host": f"{ENVD_PORT}-{unknown}.{kit.domain}"}
                )
                observed.proxy_statuses.append(answer.status_code)
            observed.probes = _probes(client) - before
        observed.packets_during_probes = kit.packets_to_agent(kit.b) - before_packets


def _probes(client: httpx.Client) -> int:
    name = "sandboxctl_envd_proxy_probes_total"
    found = next(observe.samples(client.get("/metrics").text, name), None)
    if found is None:
        raise LaneError(f"the envd proxy's /metrics has no {name}")
    return int(found.value)


SCENARIO = DeadHost()

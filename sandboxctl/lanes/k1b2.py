"""K1B2-01: a publisher restart shorter than the window is invisible.

Seven fresh sandboxes on B; with a watch open on each replica (initial events, then a
BOOKMARK), B's publisher alone gets SIGTERM and is started again at once (starting the
process takes seconds of the window already; it must be back inside the window). Polled
until one window and one publish past the stop, the latest a node whose stamps stopped
would be dropped: B's inventory is present at every poll, both replicas list B's
sandboxes as before the stop at every poll, the watches send nothing after their
opening burst, and no replica logs a line naming B meanwhile."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sandboxctl.core.timestamps import parse_rfc3339
from sandboxctl.lanes import observe
from sandboxctl.lanes.kit import Host, Kit
from sandboxctl.lanes.model import Lane, Progress, Verdict, Windows

FRESH = 7  # sandboxes claimed on B for this lane
RESTART_BOUND = 60.0  # seconds for the publisher to stop and answer again

LANE = Lane(
    id="K1B2-01",
    group="K1B2",
    proves="a publisher restart inside the window changes no list, sends no watch event "
    "after the opening burst and logs nothing about the node",
    needs=frozenset({"stop_publisher", "start_publisher", "replica_log"}),
)


@dataclass
class Poll:
    at: float  # seconds since the stop
    inventory: bool  # B's NodeInventory present in the control plane
    b_listed: dict[str, frozenset[str] | None]  # replica -> B's sandboxes (None: no answer)
    stamp: str = ""  # B's publishedAt


@dataclass
class Observed:
    fresh: frozenset[str]  # the sandboxes the lane claimed on B
    baseline: dict[str, frozenset[str]]  # replica -> B's sandboxes before the stop
    down: float = 0.0  # seconds from the SIGTERM until the new publisher answered
    stamp_before: str = ""  # B's publishedAt when its publisher got SIGTERM
    polls: list[Poll] = field(default_factory=list)
    events_after_burst: list[str] = field(default_factory=list)  # "replica: TYPE name"
    log_lines: list[str] = field(default_factory=list)  # "replica: line" naming B
    watch_failure: str = ""


def judge(observed: Observed, windows: Windows, node: str) -> Verdict:
    fresh, polls = observed.fresh, observed.polls
    gap = publish_gap(observed)
    shown_gap = "no publish seen after it" if gap is None else f"publishes {gap:.0f} s apart"
    absent = [p for p in polls if not p.inventory]
    changed = [
        (p, replica)
        for p in polls
        for replica, names in p.b_listed.items()
        if names != observed.baseline.get(replica)
    ]
    unchanged = len(polls) - len({id(p) for p, _ in changed})
    listed = sorted({len(names) for names in observed.baseline.values()})
    events, lines = observed.events_after_burst, observed.log_lines
    figure = (
        f"publisher down {observed.down:.1f} s ({shown_gap}); {len(polls)} polls: "
        f"inventory present in "
        f"{len(polls) - len(absent)}, B's {'/'.join(map(str, listed))} sandboxes "
        f"({len(fresh)} fresh) unchanged on every replica in {unchanged}; "
        f"{len(events)} watch events after the opening burst; "
        f"{len(lines)} log lines naming {node}"
    )
    bound = (
        f"publishes <= the window {windows.stale_after:.1f} s apart; at every poll: "
        f"inventory present, "
        f"both lists as before the stop; 0 events; 0 lines"
    )
    problems = []
    if not polls:
        problems.append("no poll was made")
    for replica, names in observed.baseline.items():
        if not fresh <= names:
            problems.append(f"{replica} did not list the fresh sandboxes before the stop")
    if gap is None:
        problems.append("B published no new stamp after the restart")
    elif gap > windows.stale_after:
        problems.append(
            f"B's publishes were {gap:.0f} s apart: the restart was not inside the window"
        )
    if absent:
        problems.append(f"B's inventory absent at t = {absent[0].at:.1f} s")
    if changed:
        poll, replica = changed[0]
        now = poll.b_listed[replica]
        seen = "no answer" if now is None else f"{len(now)} B sandboxes"
        problems.append(f"{replica} listed {seen} at t = {poll.at:.1f} s")
    if observed.watch_failure:
        problems.append(f"a watch failed: {observed.watch_failure}")
    if events:
        problems.append("events: " + ", ".join(events[:5]))
    if lines:
        problems.append("log: " + " | ".join(lines[:3]))
    return Verdict(LANE.id, not problems, figure, bound, "; ".join(problems))


class PublisherRestart(observe.MeasuredLane[Observed]):
    lanes: tuple[Lane, ...] = (LANE,)

    def judged(self, observed: Observed, kit: Kit, progress: Progress) -> Verdict:
        return judge(observed, kit.windows, kit.b.node)

    def measure(self, clients: observe.Clients, progress: Progress) -> Observed:
        kit = clients.kit
        clock, windows, b = self._clock, kit.windows, kit.b
        grants = observe.claim_fresh(kit, b, "k1b2", FRESH)
        fresh = frozenset(grants)
        stopped = False
        restart: _Restart | None = None
        try:
            observe.wait_listed(clients, progress, f"B's {FRESH} fresh sandboxes", fresh)
            logged = {r.name: len(kit.replica_log(r)) for r in kit.replicas}
            span = windows.stale_after + 2 * windows.publish + observe.WATCH_TICK
            seconds = span + RESTART_BOUND + 30
            with observe.watching_all(kit, progress, clock, seconds) as watches:
                baseline = {
                    r.name: frozenset(observe.on_node(observe.listed(clients, r), b.node))
                    for r in kit.replicas
                }
                observed = Observed(fresh, baseline)
                # Right after one of B's publishes, so that the window holds the restart
                # and not the rest of an interval besides.
                seen = observe.stamp_of(observe.try_inventory(kit, b))

                def newer() -> str | None:
                    now = observe.stamp_of(observe.try_inventory(kit, b))
                    return now if now and now != seen else None

                observed.stamp_before = progress.wait_for(
                    "B's next publish", newer, 2 * windows.publish + 5
                )
                start = clock()

                def poll() -> None:
                    listing = {r.name: observe.try_listed(clients, r) for r in kit.replicas}
                    found = observe.try_inventory(kit, b)
                    observed.polls.append(
                        Poll(
                            clock() - start,
                            found is not None,
                            {
                                name: None
                                if got is None
                                else frozenset(observe.on_node(got, b.node))
                                for name, got in listing.items()
                            },
                            observe.stamp_of(found),
                        )
                    )

                progress.note(f"SIGTERM to B's publisher ({b.node}), then start it again")
                stopped = True
                restart = _Restart(kit, b)
                progress.wait_for(
                    "B's publisher to stop and start again",
                    lambda: restart is not None and restart.done(poll),
                    RESTART_BOUND,
                )
                restart.raise_failure()
                stopped = False
                observed.down = clock() - start
                progress.note(f"B's publisher restarted after {observed.down:.1f} s")
                observe.observe(
                    progress,
                    "lists, inventory and watches past one window and one publish",
                    clock,
                    max(start + span, clock() + windows.publish + observe.WATCH_TICK),
                    poll,
                )
                for name, watch in watches.items():
                    observed.events_after_burst += [
                        f"{name}: {e.type} {e.name}" for e in watch.after
                    ]
                    if watch.ended and not watch.failed:
                        watch.failed = f"the watch on {name} ended before the span did"
                    observed.watch_failure = observed.watch_failure or watch.failed
            for r in kit.replicas:
                added = kit.replica_log(r)[logged[r.name] :]
                observed.log_lines += [
                    f"{r.name}: {line}" for line in _naming(added.splitlines(), b.node)
                ]
            return observed
        finally:
            if restart is not None:
                restart.join()
            if stopped:
                kit.start_publisher(b)
            observe.release(kit, b, grants)


def _naming(lines: Sequence[str], node: str) -> list[str]:
    return [line.strip() for line in lines if node in line]


def publish_gap(observed: Observed) -> float | None:
    """Seconds between B's last publish before the SIGTERM and its first after (from the
    stamps, whole seconds): what the freshness rule sees of the restart."""
    if not observed.stamp_before:
        return None
    before = parse_rfc3339(observed.stamp_before)
    for poll in observed.polls:
        if poll.stamp and poll.stamp != observed.stamp_before:
            return (parse_rfc3339(poll.stamp) - before).total_seconds()
    return None


class _Restart:
    """SIGTERM to the publisher and its start, on a thread, so that the lane polls
    throughout (starting a process takes seconds of the window)."""

    def __init__(self, kit: Kit, host: Host) -> None:
        self._failure: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(kit, host), name="lanes-k1b2-restart", daemon=True
        )
        self._thread.start()

    def _run(self, kit: Kit, host: Host) -> None:
        try:
            kit.stop_publisher(host)
            kit.start_publisher(host)
        except BaseException as error:  # raised again on the lane's thread
            self._failure = error

    def done(self, poll: Callable[[], None]) -> bool:
        poll()
        return not self._thread.is_alive()

    def join(self) -> None:
        self._thread.join(timeout=RESTART_BOUND)

    def raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure


SCENARIO = PublisherRestart()

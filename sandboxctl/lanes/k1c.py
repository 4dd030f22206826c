"""K1C-01: an old publisher that never stamps keeps its node (the freshness
rule: a missing ``publishedAt`` is fresh; docs/configuration.md).

Three fresh sandboxes on B; B's publisher is replaced by one started with ``--no-stamp``.
Once its apply has removed ``publishedAt`` from B's inventory, the lane polls for 100 s
at a 30 s publish, scaled to the kit's windows, and at least one window and one publish
(the latest a node whose stamp merely froze would be dropped), so that only the
K1 rule passes: under the newest upstream rule (unstamped = stale once any node is
stamped) B leaves at once, and an apply that kept the old stamp drops B within the
span. At every poll B's inventory is present and both replicas list B's sandboxes."""

from __future__ import annotations

from dataclasses import dataclass, field

from sandboxctl.lanes import observe
from sandboxctl.lanes.kit import Kit
from sandboxctl.lanes.model import Lane, LaneTimeout, Progress, Verdict, Windows

FRESH = 3
REFERENCE_WAIT = 100.0  # seconds, at a 30 s publish

LANE = Lane(
    id="K1C-01",
    group="K1C",
    proves="a node whose publisher never stamps publishedAt (an old publisher) stays "
    "fresh: its inventory is kept and its sandboxes listed",
    # start_publisher_unstamped: start_publisher(stamp=False), a command of its own in an
    # external kit's file (added by L3).
    needs=frozenset({"stop_publisher", "start_publisher", "start_publisher_unstamped"}),
)


def span(windows: Windows) -> float:
    """How long the unstamped publisher runs under observation."""
    return max(windows.scaled(REFERENCE_WAIT), windows.stale_after + windows.publish)


@dataclass
class Poll:
    at: float  # seconds since the unstamped inventory was first seen
    inventory: bool
    unstamped: bool
    listed: dict[str, int | None]  # replica -> how many of the fresh sandboxes it lists


@dataclass
class Observed:
    fresh: int
    unstamped_after: float | None  # seconds from the replacement to the unstamped apply
    polls: list[Poll] = field(default_factory=list)


def judge(observed: Observed, windows: Windows) -> Verdict:
    polls, fresh = observed.polls, observed.fresh
    good = [
        p
        for p in polls
        if p.inventory and p.unstamped and all(n == fresh for n in p.listed.values())
    ]
    watched = polls[-1].at if polls else 0.0
    figure = (
        f"{watched:.1f} s with B's publisher unstamped: inventory present without "
        f"{observe.STAMP} and {fresh}/{fresh} B sandboxes listed on every replica in "
        f"{len(good)} of {len(polls)} polls"
    )
    bound = (
        f"every poll, for at least {span(windows):.1f} s (100 s scaled = "
        f"{windows.scaled(REFERENCE_WAIT):.1f} s, and no less than one window and one publish)"
    )
    problems = []
    if observed.unstamped_after is None:
        problems.append(
            f"B's inventory kept {observe.STAMP}: the old publisher's apply did not clear it"
        )
    elif watched < span(windows):
        problems.append(f"observed only {watched:.1f} s")
    bad = [p for p in polls if p not in good]
    if bad:
        first = bad[0]
        if not first.inventory:
            problems.append(f"B's inventory absent at t = {first.at:.1f} s")
        elif not first.unstamped:
            problems.append(f"B's inventory stamped again at t = {first.at:.1f} s")
        else:
            counts = ", ".join(
                f"{name} {'no answer' if n is None else n}" for name, n in first.listed.items()
            )
            problems.append(f"at t = {first.at:.1f} s the replicas listed: {counts}")
    return Verdict(LANE.id, not problems, figure, bound, "; ".join(problems))


class OldPublisher(observe.MeasuredLane[Observed]):
    lanes: tuple[Lane, ...] = (LANE,)

    def judged(self, observed: Observed, kit: Kit, progress: Progress) -> Verdict:
        return judge(observed, kit.windows)

    def measure(self, clients: observe.Clients, progress: Progress) -> Observed:
        kit = clients.kit
        clock, windows, b = self._clock, kit.windows, kit.b
        grants = observe.claim_fresh(kit, b, "k1c", FRESH)
        names = frozenset(grants)
        replaced = False
        try:
            observe.wait_listed(clients, progress, f"B's {FRESH} fresh sandboxes", names)
            progress.note(f"B's publisher replaced by one with --no-stamp ({b.node})")
            replaced = True
            kit.stop_publisher(b)
            started = clock()
            kit.start_publisher(b, stamp=False)

            def unstamped() -> bool:
                found = observe.try_inventory(kit, b)
                return found is not None and observe.STAMP not in found

            try:
                progress.wait_for(
                    f"B's inventory without {observe.STAMP}", unstamped, 2 * windows.publish + 5
                )
            except LaneTimeout:  # judged: the lane cannot run without it
                return Observed(FRESH, None)
            observed = Observed(FRESH, clock() - started)
            start = clock()

            def poll() -> None:
                found = observe.try_inventory(kit, b)
                listing = {r.name: observe.try_listed(clients, r) for r in kit.replicas}
                observed.polls.append(
                    Poll(
                        clock() - start,
                        found is not None,
                        found is not None and observe.STAMP not in found,
                        {
                            name: None if got is None else len(names & observe.on_node(got, b.node))
                            for name, got in listing.items()
                        },
                    )
                )

            observe.observe(
                progress,
                f"B listed while its publisher does not stamp ({span(windows):.0f} s)",
                clock,
                start + span(windows),
                poll,
            )
            return observed
        finally:
            if replaced:
                kit.start_publisher(b)  # stamping again, as the kit was built
            observe.release(kit, b, grants)


SCENARIO = OldPublisher()

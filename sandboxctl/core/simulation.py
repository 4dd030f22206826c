"""The freshness rule played over a deterministic timeline of publishes and faults.

Each node publishes every ``publish_interval``, node *i* of *n* offset by ``i/n`` of an
interval so the fleet's stamps are spread as they are in practice. Faults: a node killed
at a time stops publishing and a restart resumes it; a control-plane write outage makes
every publish in its window fail; a skewed node stamps its own wrong clock; an old
publisher never stamps. A reader reads the fleet every ``read_tick`` through the real
:class:`FleetSnapshot` and :class:`FreshnessRule`, and every change in who it lists is
recorded with the reason.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from sandboxctl.core.durations import format_seconds
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.freshness import FreshnessRule, ReferenceMode
from sandboxctl.core.model import NodeInventory
from sandboxctl.core.snapshot import FleetSnapshot, FleetView

# A fixed origin keeps every run identical; only offsets from it are ever shown.
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Scenario:
    nodes: tuple[str, ...]
    rule: FreshnessRule
    until: timedelta
    read_tick: timedelta = timedelta(seconds=1)
    kills: Mapping[str, tuple[timedelta, ...]] = field(default_factory=dict)
    restarts: Mapping[str, tuple[timedelta, ...]] = field(default_factory=dict)
    outages: tuple[tuple[timedelta, timedelta], ...] = ()
    skews: Mapping[str, timedelta] = field(default_factory=dict)
    old_publishers: frozenset[str] = frozenset()

    def check(self) -> Scenario:
        """Refuse a scenario that names unknown nodes or impossible times."""
        if not self.nodes:
            raise InvalidValueError("--nodes: name at least one node")
        if len(set(self.nodes)) != len(self.nodes):
            raise InvalidValueError("--nodes: a node is named twice")
        named = {
            "--kill": self.kills.keys(),
            "--restart": self.restarts.keys(),
            "--skew": self.skews.keys(),
            "--old-publisher": self.old_publishers,
        }
        for flag, names in named.items():
            for name in names:
                if name not in self.nodes:
                    raise InvalidValueError(f"{flag}: unknown node {name!r} (not in --nodes)")
        if self.until <= timedelta(0):
            raise InvalidValueError("--until must be positive")
        if self.read_tick <= timedelta(0):
            raise InvalidValueError("--read-tick must be positive")
        for start, end in self.outages:
            if end <= start:
                raise InvalidValueError(
                    f"--outage {format_offset(start)}-{format_offset(end)}: "
                    "the end must be after the start"
                )
        return self


class Change(enum.StrEnum):
    JOINED = "joined"
    LEFT = "left"
    RETURNED = "returned"


@dataclass(frozen=True, slots=True)
class Transition:
    node: str
    at: timedelta
    change: Change
    reason: str


@dataclass(frozen=True, slots=True)
class LeaveBound:
    """When a killed node must leave, and when it did."""

    node: str
    last_publish: timedelta
    earliest: timedelta
    latest: timedelta
    left_at: timedelta | None

    @property
    def held(self) -> bool:
        return self.left_at is not None and self.earliest <= self.left_at <= self.latest


@dataclass(frozen=True, slots=True)
class SimulationResult:
    scenario: Scenario
    transitions: tuple[Transition, ...]
    bounds: tuple[LeaveBound, ...]
    final_states: Mapping[str, str]
    warnings: tuple[str, ...]


class _Publish(enum.IntEnum):
    # Order of simultaneous events: faults first, so a kill at 30s stops the 30s publish.
    KILL = 0
    RESTART = 1
    PUBLISH = 2


def simulate(scenario: Scenario) -> SimulationResult:
    scenario.check()
    run = _Run(scenario)
    ticks = int(scenario.until / scenario.read_tick)
    for tick in range(ticks + 1):
        now = scenario.read_tick * tick
        run.fire_until(now)
        run.read(now)
    end = scenario.read_tick * ticks
    final = run.snapshot.view(scenario.rule, EPOCH + end, end.total_seconds())
    final_states = {
        node: (final.state(node).value if run.snapshot.record(node) else "absent")
        for node in scenario.nodes
    }
    return SimulationResult(
        scenario=scenario,
        transitions=tuple(run.transitions),
        bounds=tuple(sorted(run.judged_bounds(), key=lambda b: (b.last_publish, b.node))),
        final_states=final_states,
        warnings=tuple(_warnings(scenario)),
    )


# (time, kind, node index, publisher generation, node): a kill ends a generation, so a
# publish scheduled before it never fires after a restart.
_Event = tuple[timedelta, int, int, int, str]


class _Run:
    """One simulation as it goes: the pending events, what each node did, what the
    reader lists, and the leave bounds still open."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.interval = scenario.rule.publish_interval
        self.events: list[_Event] = []
        for index, node in enumerate(scenario.nodes):
            offset = self.interval * index / len(scenario.nodes)
            heapq.heappush(self.events, (offset, _Publish.PUBLISH, index, 0, node))
            for at in scenario.kills.get(node, ()):
                heapq.heappush(self.events, (at, _Publish.KILL, index, 0, node))
            for at in scenario.restarts.get(node, ()):
                heapq.heappush(self.events, (at, _Publish.RESTART, index, 0, node))
        self.alive = dict.fromkeys(scenario.nodes, True)
        self.generation = dict.fromkeys(scenario.nodes, 0)
        self.left_at: dict[str, timedelta] = {}
        self.last_publish: dict[str, timedelta] = {}
        self.killed_at: dict[str, timedelta] = {}
        self.listed: dict[str, bool] = {}
        self.transitions: list[Transition] = []
        self.open_bounds: dict[str, LeaveBound] = {}
        self.bounds: list[LeaveBound] = []
        self.snapshot = FleetSnapshot.empty(stall_after=self.interval)

    # --- the publishers' side -------------------------------------------------------------

    def fire_until(self, now: timedelta) -> None:
        """Every event due by ``now``, in order."""
        while self.events and self.events[0][0] <= now:
            at, kind, index, gen, node = heapq.heappop(self.events)
            if kind == _Publish.KILL:
                self._on_kill(node, at)
            elif kind == _Publish.RESTART:
                self._on_restart(node, index, at)
            elif self.alive[node] and gen == self.generation[node]:
                self._on_publish(node, index, gen, at)

    def _on_kill(self, node: str, at: timedelta) -> None:
        if not self.alive[node]:
            return
        self.alive[node] = False
        self.generation[node] += 1
        self.killed_at[node] = at
        if node in self.last_publish and node not in self.scenario.old_publishers:
            self.open_bounds[node] = _bound(self.scenario, node, self.last_publish[node])

    def _on_restart(self, node: str, index: int, at: timedelta) -> None:
        if self.alive[node]:
            return
        self.alive[node] = True
        self.open_bounds.pop(node, None)  # back before it left: no bound to judge
        heapq.heappush(self.events, (at, _Publish.PUBLISH, index, self.generation[node], node))

    def _on_publish(self, node: str, index: int, gen: int, at: timedelta) -> None:
        heapq.heappush(self.events, (at + self.interval, _Publish.PUBLISH, index, gen, node))
        if not _in_outage(self.scenario, at):
            inventory = _publish(self.scenario, node, at)
            self.snapshot = self.snapshot.replace(inventory, at.total_seconds())
            self.last_publish[node] = at

    # --- the reader's side ----------------------------------------------------------------

    def read(self, now: timedelta) -> None:
        """Read the fleet at ``now``: a transition for each node whose listing changed."""
        view = self.snapshot.view(self.scenario.rule, EPOCH + now, now.total_seconds())
        for node in self.scenario.nodes:
            present = self.snapshot.record(node) is not None and view.is_fresh(node)
            before = self.listed.get(node)
            if present == before or (before is None and not present):
                continue
            self.listed[node] = present
            self._transition(view, node, before, present, now)

    def _transition(
        self, view: FleetView, node: str, before: bool | None, present: bool, now: timedelta
    ) -> None:
        change = Change.JOINED if before is None else (Change.RETURNED if present else Change.LEFT)
        reason = _reason(
            self.scenario, view, node, change, self.last_publish, self.killed_at, self.left_at, now
        )
        self.transitions.append(Transition(node, now, change, reason))
        if change is not Change.LEFT:
            return
        self.left_at[node] = now
        bound = self.open_bounds.pop(node, None)
        if bound is not None:
            self.bounds.append(replace(bound, left_at=now))

    def judged_bounds(self) -> list[LeaveBound]:
        """The bounds of killed nodes that left, and of those still listed that should
        have: still listed is a failure only if a live node published past the bound,
        which is what moves the reference. With nobody publishing, keeping it is the rule."""
        judged = list(self.bounds)
        for node, bound in self.open_bounds.items():
            others = [at for other, at in self.last_publish.items() if other != node]
            if others and max(others) > bound.latest:
                judged.append(bound)
        return judged


def _publish(scenario: Scenario, node: str, at: timedelta) -> NodeInventory:
    stamp = None
    if node not in scenario.old_publishers:
        stamp = EPOCH + at + scenario.skews.get(node, timedelta(0))
    return NodeInventory(node=node, address=f"{node}:7777", published_at=stamp)


def _in_outage(scenario: Scenario, at: timedelta) -> bool:
    return any(start <= at < end for start, end in scenario.outages)


def _bound(scenario: Scenario, node: str, last: timedelta) -> LeaveBound:
    """Between stale-after and stale-after plus one interval (publish mode) or one read tick
    (extrapolate) after the last publish; an outage in the way shifts the bound by its
    length less one interval (the stall credit), plus one interval of slack."""
    rule = scenario.rule
    interval = rule.publish_interval
    slack = scenario.read_tick
    if rule.mode is ReferenceMode.PUBLISH:
        slack += interval
    earliest = last + rule.stale_after
    latest = earliest + slack
    for start, end in sorted(scenario.outages):
        if end <= last:
            continue
        if start < earliest:  # the outage holds the reference back before it could leave
            length = end - max(start, last)
            earliest += max(timedelta(0), length - interval)
            latest += length + interval
        elif start < latest:  # it may leave before the outage, or only after it
            latest += end - start + interval
    return LeaveBound(node, last, earliest, latest, None)


def _reason(
    scenario: Scenario,
    view: FleetView,
    node: str,
    change: Change,
    last_publish: Mapping[str, timedelta],
    killed_at: Mapping[str, timedelta],
    left_at: Mapping[str, timedelta],
    now: timedelta,
) -> str:
    fmt = format_offset
    if change is Change.JOINED:
        return "first publish" + _stamp_note(scenario, node)
    if change is Change.RETURNED:
        if last_publish[node] >= left_at[node]:
            return f"published again at {fmt(last_publish[node])}" + _stamp_note(scenario, node)
        return (
            f"no publish since {fmt(last_publish[node])}, but the reader saw nobody publish "
            "for longer than an interval, and that stall is not held against the node"
        )
    reference = view.reference
    age = view.age(node)
    assert age is not None
    why = f"age {fmt(age)} > stale-after {fmt(scenario.rule.stale_after)} behind the reference"
    why += f" ({reference.origin.value})"
    if node in killed_at and killed_at[node] <= now:
        cause = f"killed at {fmt(killed_at[node])}"
    elif node in scenario.skews:
        cause = f"clock skewed {fmt(scenario.skews[node])}"
    else:
        cause = "no publish landed"
    return f"{cause}; last publish at {fmt(last_publish[node])}; {why}"


def _stamp_note(scenario: Scenario, node: str) -> str:
    if node in scenario.old_publishers:
        return " (unstamped: an old publisher is always fresh)"
    skew = scenario.skews.get(node)
    if skew:
        return f" (stamps skewed {format_offset(skew)})"
    return ""


def _warnings(scenario: Scenario) -> list[str]:
    warnings = list(scenario.rule.warnings())
    for node, skew in scenario.skews.items():
        if -skew > scenario.rule.stale_after:
            warnings.append(
                f"{node}'s clock runs {format_offset(-skew)} behind, more than stale-after: "
                "it is dropped while it is alive"
            )
    for node, skew in scenario.skews.items():
        if skew > timedelta(0):
            warnings.append(
                f"{node} stamps {format_offset(skew)} ahead of the reader: while it is newest the "
                "reference is capped by the reader's clock, so an outage longer than stale-after "
                "drops the other nodes"
            )
    return warnings


def format_offset(value: timedelta) -> str:
    """Offsets on the timeline in plain seconds (``97.5s``), as the flags name them."""
    return format_seconds(value)

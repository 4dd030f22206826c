"""Every lane, in the order a run takes them, and how selectors pick them."""

from __future__ import annotations

from collections.abc import Sequence

from sandboxctl.lanes import guard, k1a, k1b2, k1c, k1out, sbl
from sandboxctl.lanes.model import Lane, LaneError, Scenario

# The scenarios in run order: each leaves the kit healed for the next. A module adds its
# scenario here.
SCENARIOS: tuple[Scenario, ...] = (
    sbl.SCENARIO,
    k1a.SCENARIO,  # before the publisher and outage lanes
    k1b2.SCENARIO,
    k1c.SCENARIO,
    k1out.SCENARIO,
    k1out.ETCD_SCENARIO,  # K1OUT-02, one layer down
    guard.SCENARIO,  # last: its own objects and guards, removed when it ends
)

ALL = "all"


def lanes() -> list[Lane]:
    return [lane for scenario in SCENARIOS for lane in scenario.lanes]


def groups() -> list[str]:
    return list(dict.fromkeys(lane.group for lane in lanes()))


def select(selectors: Sequence[str], kit: str) -> list[tuple[Scenario, frozenset[str]]]:
    """The scenarios to run and, for each, the lanes selected: a selector is a lane id
    (K1A-03), a group (K1A) or ``all``, case-insensitive. A lane that cannot run on
    ``kit`` is refused when named by id and left out when named by group or ``all``."""
    if not selectors:
        raise LaneError("name at least one lane, group or 'all' (see: sandboxctl lanes list)")
    by_id = {lane.id.upper(): lane for lane in lanes()}
    known_groups = {group.upper() for group in groups()}
    chosen: set[str] = set()
    for selector in selectors:
        key = selector.strip().upper()
        if key == ALL.upper():
            chosen |= {lane.id for lane in lanes() if kit in lane.kits}
        elif key in known_groups:
            chosen |= {
                lane.id for lane in lanes() if lane.group.upper() == key and kit in lane.kits
            }
        elif key in by_id:
            lane = by_id[key]
            if kit not in lane.kits:
                raise LaneError(f"lane {lane.id} does not run on the {kit} kit")
            chosen.add(lane.id)
        else:
            raise LaneError(
                f"no lane or group {selector!r}; groups: {', '.join(groups())}, or 'all'"
            )
    plan = []
    for scenario in SCENARIOS:
        picked = frozenset(lane.id for lane in scenario.lanes if lane.id in chosen)
        if picked:
            plan.append((scenario, picked))
    return plan

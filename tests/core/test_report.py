"""node_rows / count_states: what `sandboxctl inventory` reports, as plain values."""

from __future__ import annotations

from sandboxctl.core.freshness import FreshnessRule, NodeState
from sandboxctl.core.report import NodeRow, count_states, node_rows
from sandboxctl.core.snapshot import FleetSnapshot
from tests.core.fleet_factory import T0, at, entry, inv, pool, sec

RULE = FreshnessRule()


def test_rows_cover_every_node_in_name_order_stale_ones_included():
    snapshot = FleetSnapshot.build(
        [
            inv("rogue", at(3600)),
            inv("stale", at(-91), address="s:1", entries=(entry("t/x"), entry("t/y"))),
            inv("old", pools=(pool("python", 2), pool("node", 3))),
            inv("fresh", at(-30), address="f:1", pools=(pool("python", 1),)),
        ]
    )
    rows = node_rows(snapshot.view(RULE, T0))
    assert rows == [
        NodeRow("fresh", "f:1", at(-30), sec(30), NodeState.FRESH, 0, 1),
        NodeRow("old", "", None, None, NodeState.UNSTAMPED, 0, 5),
        NodeRow("rogue", "", at(3600), -sec(3600), NodeState.AHEAD, 0, 0),
        NodeRow("stale", "s:1", at(-91), sec(91), NodeState.STALE, 2, 0),
    ]


def test_age_is_unknown_before_any_stamp_gives_a_reference():
    rows = node_rows(FleetSnapshot.build([inv("a"), inv("b")]).view(RULE, T0))
    assert [(r.age, r.state) for r in rows] == [(None, NodeState.UNSTAMPED)] * 2


def test_count_states_names_every_state_even_when_none_is_in_it():
    snapshot = FleetSnapshot.build([inv("a", T0), inv("b", T0), inv("c", at(-91))])
    counts = count_states(node_rows(snapshot.view(RULE, T0)))
    assert counts == {"fresh": 2, "stale": 1, "unstamped": 0, "ahead": 0}


def test_an_empty_fleet_reports_no_rows_and_zero_counts():
    rows = node_rows(FleetSnapshot.empty().view(RULE, T0))
    assert rows == []
    assert set(count_states(rows).values()) == {0}

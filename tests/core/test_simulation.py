"""simulate(): the rule played over a timeline of publishes and faults.

Three nodes a, b, c publish at 0/10/20 s and every 30 s after (default 30 s interval).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.freshness import FreshnessRule, ReferenceMode
from sandboxctl.core.simulation import (
    Change,
    LeaveBound,
    Scenario,
    format_offset,
    simulate,
)
from tests.core.fleet_factory import quick, sec

PUBLISH = FreshnessRule()
EXTRAPOLATE = FreshnessRule(mode=ReferenceMode.EXTRAPOLATE)
ABC = ("a", "b", "c")


def scenario(**overrides) -> Scenario:
    fields = {"nodes": ABC, "rule": PUBLISH, "until": sec(300)}
    fields.update(overrides)
    return Scenario(**fields)


def changes(result, change=None, node=None):
    """(node, change, seconds) for every transition, optionally filtered."""
    return [
        (t.node, t.change, t.at.total_seconds())
        for t in result.transitions
        if (change is None or t.change is change) and (node is None or t.node == node)
    ]


def bound_of(result, node) -> LeaveBound:
    (bound,) = [b for b in result.bounds if b.node == node]
    return bound


# --- a quiet fleet ---------------------------------------------------------------------------


def test_each_node_joins_at_its_first_publish():
    result = simulate(scenario(until=sec(60)))
    assert changes(result) == [
        ("a", Change.JOINED, 0),
        ("b", Change.JOINED, 10),
        ("c", Change.JOINED, 20),
    ]
    assert result.transitions[0].reason == "first publish"
    assert result.bounds == ()
    assert dict(result.final_states) == {"a": "fresh", "b": "fresh", "c": "fresh"}


def test_a_node_never_published_is_absent():
    result = simulate(scenario(until=sec(5)))
    assert dict(result.final_states) == {"a": "fresh", "b": "absent", "c": "absent"}


# --- kills ---------------------------------------------------------------------------------


def test_a_killed_node_leaves_within_its_bound_in_publish_mode():
    result = simulate(scenario(kills={"b": (sec(45),)}))
    assert changes(result, Change.LEFT) == [("b", Change.LEFT, 140)]
    bound = bound_of(result, "b")
    # must leave between 40 + 90 and that plus one interval and one read tick
    assert bound == LeaveBound("b", sec(40), sec(130), sec(161), left_at=sec(140))
    assert bound.held
    assert sec(90) < bound.left_at - bound.last_publish <= sec(90) + sec(30) + sec(1)
    assert result.final_states["b"] == "stale"
    assert result.final_states["a"] == "fresh"


def test_a_killed_node_leaves_within_its_bound_in_extrapolate_mode():
    result = simulate(scenario(rule=EXTRAPOLATE, kills={"b": (sec(45),)}))
    assert changes(result, Change.LEFT) == [("b", Change.LEFT, 131)]
    bound = bound_of(result, "b")
    # must leave between 40 + 90 and that plus one read tick
    assert bound == LeaveBound("b", sec(40), sec(130), sec(131), left_at=sec(131))
    assert bound.held


def test_the_left_reason_names_the_kill_and_the_last_publish():
    result = simulate(scenario(kills={"b": (sec(45),)}))
    (left,) = [t for t in result.transitions if t.change is Change.LEFT]
    assert left.reason.startswith("killed at 45s; last publish at 40s; age 100s > stale-after 90s")


def test_a_kill_at_a_publish_instant_stops_that_publish():
    result = simulate(scenario(kills={"b": (sec(40),)}))
    assert bound_of(result, "b").last_publish == sec(10)


def test_a_kill_before_the_first_publish_never_joins_and_sets_no_bound():
    result = simulate(scenario(kills={"c": (sec(5),)}))
    assert changes(result, node="c") == []
    assert result.bounds == ()
    assert result.final_states["c"] == "absent"


def test_a_bound_is_broken_when_the_node_leaves_too_late():
    bound = LeaveBound("b", sec(40), sec(130), sec(161), left_at=sec(162))
    assert not bound.held
    assert not LeaveBound("b", sec(40), sec(130), sec(161), left_at=sec(129)).held
    assert not LeaveBound("b", sec(40), sec(130), sec(161), left_at=None).held
    assert LeaveBound("b", sec(40), sec(130), sec(161), left_at=sec(161)).held


@quick
@given(
    count=st.integers(min_value=2, max_value=5),
    victim=st.integers(min_value=0, max_value=4),
    kill=st.integers(min_value=1, max_value=200),
    mode=st.sampled_from(list(ReferenceMode)),
)
def test_a_killed_node_always_leaves_within_the_documented_window(count, victim, kill, mode):
    nodes = tuple(f"n{i}" for i in range(count))
    node = nodes[victim % count]
    rule = FreshnessRule(mode=mode)
    result = simulate(Scenario(nodes, rule, until=sec(400), kills={node: (sec(kill),)}))
    bounds = [b for b in result.bounds if b.node == node]
    if not bounds:  # killed before its first publish: it never joined
        assert changes(result, node=node) == []
        return
    (bound,) = bounds
    assert bound.left_at is not None
    gone_after = bound.left_at - bound.last_publish
    slack = sec(1) if mode is ReferenceMode.EXTRAPOLATE else sec(30) + sec(1)
    assert sec(90) < gone_after <= sec(90) + slack
    assert bound.held
    assert changes(result, Change.LEFT) == [(node, Change.LEFT, bound.left_at.total_seconds())]


# --- restarts ------------------------------------------------------------------------------


def test_a_restart_inside_the_window_is_invisible():
    result = simulate(scenario(kills={"b": (sec(45),)}, restarts={"b": (sec(100),)}))
    assert changes(result, node="b") == [("b", Change.JOINED, 10)]
    assert result.final_states["b"] == "fresh"


def test_a_restart_inside_the_window_is_not_reported_as_a_missed_leave_bound():
    # The node came back before it was due to leave; no bound should say it failed to go.
    result = simulate(scenario(kills={"b": (sec(45),)}, restarts={"b": (sec(100),)}))
    assert [b for b in result.bounds if b.node == "b" and not b.held] == []


def test_a_restart_after_the_node_left_brings_it_back():
    result = simulate(scenario(kills={"b": (sec(45),)}, restarts={"b": (sec(200),)}))
    assert changes(result, node="b") == [
        ("b", Change.JOINED, 10),
        ("b", Change.LEFT, 140),
        ("b", Change.RETURNED, 200),
    ]
    assert result.transitions[-1].reason == "published again at 200s"


def test_a_restarted_node_publishes_every_interval_from_its_restart():
    # Restarted at 50 s, b publishes at 50, 80, ..., 170 s; killed again at 200 s its last
    # publish is 170 s. (The schedule it had before the first kill must not resume too.)
    result = simulate(
        scenario(
            until=sec(400),
            kills={"b": (sec(45), sec(200))},
            restarts={"b": (sec(50),)},
        )
    )
    assert bound_of(result, "b").last_publish == sec(170)


def test_a_restart_of_a_live_node_changes_nothing():
    restarted = simulate(scenario(restarts={"b": (sec(100),)}))
    quiet = simulate(scenario())
    assert restarted.transitions == quiet.transitions
    assert restarted.bounds == quiet.bounds == ()
    assert restarted.final_states == quiet.final_states
    # ... and adds no second publish schedule: killed at 200 s, b last published at 190 s.
    killed = simulate(scenario(restarts={"b": (sec(105),)}, kills={"b": (sec(200),)}))
    assert bound_of(killed, "b").last_publish == sec(190)


# --- control-plane outage ------------------------------------------------------------------


def test_a_ten_minute_write_outage_drops_nobody():
    for rule in (PUBLISH, EXTRAPOLATE):
        result = simulate(scenario(rule=rule, until=sec(659), outages=((sec(60), sec(660)),)))
        assert changes(result, Change.LEFT) == []
        assert set(result.final_states.values()) == {"fresh"}


def test_an_hour_long_outage_drops_nobody_in_extrapolate_mode():
    result = simulate(scenario(rule=EXTRAPOLATE, until=sec(3659), outages=((sec(60), sec(3660)),)))
    assert changes(result, Change.LEFT) == []


def test_the_end_of_a_ten_minute_outage_drops_nobody():
    # simulate() reads with stall credit: the first publish after the outage is not a reason
    # to drop the nodes whose own publish lands a few seconds later.
    for rule in (PUBLISH, EXTRAPOLATE):
        result = simulate(scenario(rule=rule, until=sec(900), outages=((sec(60), sec(660)),)))
        assert changes(result, Change.LEFT) == [], rule.mode


def test_a_node_killed_before_an_outage_leaves_within_its_shifted_bound():
    # b's last publish is 40 s; the outage credits it 600 - 30 = 570 s, so the bound moves
    # from [130, 130 + slack] to [130 + 570, 130 + slack + 600 + 30], slack being one
    # interval plus one read tick (publish) or one read tick (extrapolate).
    for rule, left, latest in ((PUBLISH, 720, 791), (EXTRAPOLATE, 711, 761)):
        result = simulate(
            scenario(
                rule=rule, until=sec(900), kills={"b": (sec(45),)}, outages=((sec(60), sec(660)),)
            )
        )
        assert changes(result, Change.LEFT) == [("b", Change.LEFT, left)]
        bound = bound_of(result, "b")
        assert bound == LeaveBound("b", sec(40), sec(700), sec(latest), left_at=sec(left))
        assert bound.held


def test_with_a_node_stamping_ahead_an_outage_longer_than_stale_after_drops_the_others():
    # The documented limitation (see the skew warning): the reference is the reader's clock
    # while the rogue is newest, so frozen honest stamps age out 91 s after their last publish.
    result = simulate(
        scenario(skews={"a": sec(3600)}, until=sec(299), outages=((sec(60), sec(300)),))
    )
    assert changes(result, Change.LEFT) == [("b", Change.LEFT, 131), ("c", Change.LEFT, 141)]
    assert any(
        "an outage longer than stale-after drops the other nodes" in w for w in result.warnings
    )


def test_a_returned_reason_never_names_a_publish_from_before_the_node_left():
    result = simulate(
        scenario(skews={"a": sec(3600)}, until=sec(400), outages=((sec(60), sec(300)),))
    )
    left_at = {}
    for t in result.transitions:
        if t.change is Change.LEFT:
            left_at[t.node] = t.at
        elif t.change is Change.RETURNED and t.reason.startswith("published again at "):
            said = float(t.reason.removeprefix("published again at ").split("s")[0])
            assert sec(said) >= left_at[t.node], t


def test_an_outage_does_not_hide_a_kill():
    # b dies at 45 s; an outage from 100 s to 110 s only delays a live stamp past 130 s.
    result = simulate(scenario(kills={"b": (sec(45),)}, outages=((sec(100), sec(110)),)))
    assert bound_of(result, "b").held


# --- all nodes stop, one-node fleet ----------------------------------------------------------


def test_a_fleet_whose_nodes_all_stop_keeps_its_last_inventory():
    kills = {n: (sec(100),) for n in ABC}
    for rule in (PUBLISH, EXTRAPOLATE):
        result = simulate(scenario(rule=rule, until=sec(2000), kills=kills))
        assert changes(result, Change.LEFT) == []
        assert set(result.final_states.values()) == {"fresh"}


def test_a_one_node_fleet_keeps_its_inventory_forever():
    for rule in (PUBLISH, EXTRAPOLATE):
        result = simulate(Scenario(("solo",), rule, until=sec(3600), kills={"solo": (sec(1),)}))
        assert changes(result) == [("solo", Change.JOINED, 0)]
        assert result.final_states == {"solo": "fresh"}


# --- skew and old publishers -----------------------------------------------------------------


def test_a_node_stamping_an_hour_ahead_evicts_nobody():
    result = simulate(scenario(skews={"a": timedelta(hours=1)}, until=sec(600)))
    assert changes(result, Change.LEFT) == []
    assert dict(result.final_states) == {"a": "ahead", "b": "fresh", "c": "fresh"}
    assert "stamps skewed 3600s" in result.transitions[0].reason


def test_a_node_whose_clock_runs_behind_by_more_than_the_window_is_dropped_while_alive():
    # b stamps 130 s behind; when it publishes, the newest stamp (a's, 10 s earlier) is still
    # 120 s ahead of b's, so b is never listed although it never stops publishing.
    result = simulate(scenario(skews={"b": -sec(130)}))
    assert changes(result, node="b") == []
    assert result.final_states["b"] == "stale"
    assert any("b's clock runs 130s behind" in w for w in result.warnings)


def test_a_node_behind_by_less_than_the_window_is_kept():
    result = simulate(scenario(skews={"b": -sec(60)}))
    assert changes(result, Change.LEFT) == []
    assert result.final_states["b"] == "fresh"


def test_an_old_publisher_never_leaves_even_when_killed():
    result = simulate(
        scenario(old_publishers=frozenset({"b"}), kills={"b": (sec(45),)}, until=sec(1000))
    )
    assert changes(result, node="b") == [("b", Change.JOINED, 10)]
    assert "unstamped" in result.transitions[1].reason
    assert result.final_states["b"] == "unstamped"


# --- checking the scenario -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "overrides"),
    [
        ("--kill", {"kills": {"zz": (sec(5),)}}),
        ("--restart", {"restarts": {"zz": (sec(5),)}}),
        ("--skew", {"skews": {"zz": sec(5)}}),
        ("--old-publisher", {"old_publishers": frozenset({"zz"})}),
    ],
)
def test_check_refuses_an_unknown_node_naming_the_flag(flag, overrides):
    with pytest.raises(InvalidValueError) as caught:
        scenario(**overrides).check()
    message = str(caught.value)
    assert message.startswith(flag + ":")
    assert "'zz'" in message


def test_simulate_checks_its_scenario():
    with pytest.raises(InvalidValueError, match="--kill"):
        simulate(scenario(kills={"zz": (sec(5),)}))


@pytest.mark.parametrize(
    "outage", [(sec(100), sec(50)), (sec(100), sec(100))], ids=["reversed", "empty"]
)
def test_check_refuses_an_outage_that_ends_before_it_starts(outage):
    with pytest.raises(InvalidValueError, match=r"--outage 100s-") as caught:
        scenario(outages=(outage,)).check()
    assert "the end must be after the start" in str(caught.value)


def test_check_refuses_a_node_named_twice():
    with pytest.raises(InvalidValueError, match="--nodes"):
        scenario(nodes=("a", "b", "a")).check()


def test_check_refuses_an_empty_fleet():
    with pytest.raises(InvalidValueError, match="--nodes"):
        scenario(nodes=()).check()


@pytest.mark.parametrize(("field", "flag"), [("until", "--until"), ("read_tick", "--read-tick")])
def test_check_refuses_non_positive_times(field, flag):
    with pytest.raises(InvalidValueError, match=flag):
        scenario(**{field: timedelta(0)}).check()


def test_check_returns_the_scenario():
    s = scenario()
    assert s.check() is s


# --- warnings and determinism --------------------------------------------------------------


def test_warns_when_stale_after_is_not_above_the_publish_interval():
    result = simulate(scenario(rule=FreshnessRule(stale_after=sec(30)), until=sec(60)))
    assert any("stale-after 30s" in w for w in result.warnings)


def test_a_safe_scenario_has_no_warnings():
    assert simulate(scenario(until=sec(60))).warnings == ()


def test_a_skew_ahead_warns_about_outages():
    result = simulate(scenario(skews={"a": sec(60)}, until=sec(60)))
    assert any(w.startswith("a stamps 60s ahead") for w in result.warnings)


def test_the_result_is_deterministic():
    def run():
        return simulate(
            scenario(
                until=sec(900),
                kills={"b": (sec(45),)},
                restarts={"b": (sec(400),)},
                outages=((sec(500), sec(700)),),
                skews={"c": sec(3600)},
                old_publishers=frozenset({"a"}),
            )
        )

    first, second = run(), run()
    assert first == second
    assert first.transitions  # a run with something in it


def test_transitions_are_in_time_order():
    result = simulate(
        scenario(kills={"a": (sec(35),), "b": (sec(45),)}, restarts={"a": (sec(250),)})
    )
    times = [t.at for t in result.transitions]
    assert times == sorted(times)
    assert len(times) == 3 + 2 + 1  # three joins, a and b leave, a returns


def test_format_offset_prints_plain_seconds():
    assert format_offset(sec(97.5)) == "97.5s"
    assert format_offset(sec(3600)) == "3600s"
    assert format_offset(-sec(100)) == "-100s"

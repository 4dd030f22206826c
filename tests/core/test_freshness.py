"""The freshness rule (docs/configuration.md): reference, boundary, states, settings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandboxctl.core.errors import ConfigurationError
from sandboxctl.core.freshness import (
    FreshnessRule,
    NodeState,
    Reference,
    ReferenceMode,
    ReferenceOrigin,
)
from tests.core.fleet_factory import T0, at, quick, sec

RULE = FreshnessRule()
EXTRAPOLATE = FreshnessRule(stale_after=sec(91), mode=ReferenceMode.EXTRAPOLATE)


def ref_at(when: datetime) -> Reference:
    return Reference(when, ReferenceOrigin.NEWEST_PUBLISH, when)


# --- defaults and the boundary ----------------------------------------------------------------


def test_default_rule_is_a_90s_window_over_a_30s_publish_interval_in_publish_mode():
    assert RULE.stale_after == sec(90)
    assert RULE.publish_interval == sec(30)
    assert RULE.mode is ReferenceMode.PUBLISH


def test_age_of_exactly_stale_after_is_kept():
    assert not RULE.is_stale(T0, ref_at(at(90)))


def test_age_one_second_past_stale_after_is_dropped():
    assert RULE.is_stale(T0, ref_at(at(91)))


def test_age_one_microsecond_past_stale_after_is_dropped():
    assert RULE.is_stale(T0, ref_at(at(90) + timedelta(microseconds=1)))


def test_custom_stale_after_10s_drops_an_11s_old_stamp():
    assert FreshnessRule(stale_after=sec(10)).is_stale(T0, ref_at(at(11)))


def test_custom_stale_after_10s_keeps_a_10s_old_stamp():
    assert not FreshnessRule(stale_after=sec(10)).is_stale(T0, ref_at(at(10)))


def test_credit_is_taken_off_the_age():
    reference = ref_at(at(100))
    assert not RULE.is_stale(T0, reference, credit=sec(10))
    assert RULE.is_stale(T0, reference, credit=sec(9))
    assert RULE.state(T0, reference, at(100), credit=sec(10)) is NodeState.FRESH
    assert RULE.state(T0, reference, at(100), credit=sec(9)) is NodeState.STALE


def test_cutoff_is_the_reference_minus_stale_after():
    assert RULE.cutoff(ref_at(at(100))) == at(10)


# --- the reference --------------------------------------------------------------------------


def test_reference_is_the_newest_stamp_when_it_is_not_ahead_of_now():
    reference = RULE.reference(newest=at(0), now=at(600))
    assert reference == Reference(at(0), ReferenceOrigin.NEWEST_PUBLISH, at(0))


def test_reference_is_capped_by_now_when_the_newest_stamp_is_ahead():
    reference = RULE.reference(newest=at(3600), now=at(0))
    assert reference.at == at(0)
    assert reference.origin is ReferenceOrigin.CAPPED_BY_NOW
    assert reference.newest == at(3600)


def test_newest_stamp_equal_to_now_is_not_reported_as_capped():
    reference = RULE.reference(newest=at(5), now=at(5))
    assert (reference.at, reference.origin) == (at(5), ReferenceOrigin.NEWEST_PUBLISH)


def test_no_stamp_anywhere_gives_no_reference_and_everyone_is_fresh():
    reference = RULE.reference(newest=None, now=at(0))
    assert reference == Reference(None, ReferenceOrigin.NONE, None)
    assert RULE.cutoff(reference) is None
    assert not RULE.is_stale(at(-86400), reference)
    assert RULE.state(at(-86400), reference, at(0)) is NodeState.FRESH


def test_publish_mode_ignores_the_monotonic_clock():
    reference = RULE.reference(at(0), now=at(600), newest_seen_at=100.0, monotonic=125.0)
    assert (reference.at, reference.origin) == (at(0), ReferenceOrigin.NEWEST_PUBLISH)


# --- states ---------------------------------------------------------------------------------


def test_unstamped_node_is_fresh_even_when_others_are_stamped():
    reference = RULE.reference(newest=at(0), now=at(0))
    assert not RULE.is_stale(None, reference)
    assert RULE.state(None, reference, at(0)) is NodeState.UNSTAMPED


def test_stamp_ahead_of_now_is_ahead_not_stale():
    now = at(0)
    reference = RULE.reference(newest=at(3600), now=now)
    assert not RULE.is_stale(at(3600), reference)
    assert RULE.state(at(3600), reference, now) is NodeState.AHEAD


def test_stamp_ahead_of_now_does_not_evict_nodes_stamped_now():
    now = at(0)
    reference = RULE.reference(newest=at(3600), now=now)
    assert RULE.state(now, reference, now) is NodeState.FRESH
    assert RULE.state(at(-90), reference, now) is NodeState.FRESH


def test_lookup_with_no_reference_yet_is_fresh_even_for_a_stamp_an_hour_old():
    now = at(3600)
    assert not RULE.is_stale(at(0), None)
    assert not RULE.is_stale(at(0), Reference(None, ReferenceOrigin.NONE, None))
    assert RULE.state(at(0), Reference(None, ReferenceOrigin.NONE, None), now) is NodeState.FRESH


def test_node_behind_the_fleet_by_more_than_the_window_is_dropped_although_alive():
    # The node publishes on time, but its clock runs 100 s behind a fleet stamped "now".
    now = at(0)
    reference = RULE.reference(newest=now, now=now)
    assert RULE.state(at(-100), reference, now) is NodeState.STALE


def test_stale_wins_over_every_other_state():
    reference = ref_at(at(200))
    assert RULE.state(at(0), reference, now=at(0)) is NodeState.STALE


# --- extrapolate mode -----------------------------------------------------------------------


def test_extrapolate_advances_with_monotonic_time_since_newest_was_first_seen():
    reference = EXTRAPOLATE.reference(at(0), now=at(3600), newest_seen_at=1000.0, monotonic=1010.0)
    assert reference.at == at(10)
    assert reference.origin is ReferenceOrigin.EXTRAPOLATED
    assert reference.newest == at(0)


def test_extrapolate_runs_at_most_one_publish_interval_past_newest():
    reference = EXTRAPOLATE.reference(at(0), now=at(3600), newest_seen_at=1000.0, monotonic=4600.0)
    assert reference.at == at(30)
    assert reference.origin is ReferenceOrigin.EXTRAPOLATED


def test_extrapolate_is_capped_by_now():
    reference = EXTRAPOLATE.reference(at(0), now=at(5), newest_seen_at=1000.0, monotonic=1020.0)
    assert (reference.at, reference.origin) == (at(5), ReferenceOrigin.CAPPED_BY_NOW)


def test_extrapolate_without_a_monotonic_reading_uses_the_newest_stamp():
    reference = EXTRAPOLATE.reference(at(0), now=at(60))
    assert (reference.at, reference.origin) == (at(0), ReferenceOrigin.NEWEST_PUBLISH)


def test_extrapolate_never_runs_backwards_when_monotonic_precedes_seen_at():
    reference = EXTRAPOLATE.reference(at(0), now=at(60), newest_seen_at=1000.0, monotonic=990.0)
    assert (reference.at, reference.origin) == (at(0), ReferenceOrigin.NEWEST_PUBLISH)


def test_extrapolate_drops_a_node_the_publish_reference_still_keeps():
    # Newest stamp at 0 seen at monotonic 1000; a node stamped -70 s. At monotonic 1025 the
    # extrapolated reference is 25 s, the node is 95 s behind it; publish mode sees 70 s.
    ref_extrapolated = EXTRAPOLATE.reference(at(0), at(25), 1000.0, 1025.0)
    ref_publish = RULE.reference(at(0), at(25), 1000.0, 1025.0)
    assert EXTRAPOLATE.is_stale(at(-70), ref_extrapolated)
    assert not EXTRAPOLATE.is_stale(at(-70), ref_publish)


# --- settings -------------------------------------------------------------------------------


def test_validate_returns_the_rule_for_chaining():
    assert RULE.validate() is RULE
    assert EXTRAPOLATE.validate() is EXTRAPOLATE


@pytest.mark.parametrize("stale_after", [sec(60), sec(59), sec(30)])
def test_extrapolate_refuses_stale_after_not_above_twice_the_publish_interval(stale_after):
    rule = FreshnessRule(stale_after=stale_after, mode=ReferenceMode.EXTRAPOLATE)
    with pytest.raises(ConfigurationError) as caught:
        rule.validate()
    message = str(caught.value)
    assert "--inventory-stale-after" in message
    assert "--publish-interval" in message


def test_extrapolate_accepts_91s_over_a_30s_interval():
    FreshnessRule(
        stale_after=sec(91), mode=ReferenceMode.EXTRAPOLATE, publish_interval=sec(30)
    ).validate()


def test_allow_unsafe_accepts_an_unsafe_extrapolate_window_but_not_a_non_positive_one():
    rule = FreshnessRule(stale_after=sec(60), mode=ReferenceMode.EXTRAPOLATE)
    assert rule.validate(allow_unsafe=True) is rule
    with pytest.raises(ConfigurationError, match="--inventory-stale-after"):
        FreshnessRule(stale_after=timedelta(0)).validate(allow_unsafe=True)


def test_publish_mode_accepts_a_window_of_twice_the_interval():
    FreshnessRule(stale_after=sec(60)).validate()


@pytest.mark.parametrize("stale_after", [timedelta(0), sec(-5)])
def test_non_positive_stale_after_is_refused(stale_after):
    with pytest.raises(ConfigurationError, match="--inventory-stale-after"):
        FreshnessRule(stale_after=stale_after).validate()


def test_non_positive_publish_interval_is_refused():
    with pytest.raises(ConfigurationError, match="--publish-interval"):
        FreshnessRule(publish_interval=timedelta(0)).validate()


def test_default_rule_has_no_warnings():
    assert RULE.warnings() == []
    assert EXTRAPOLATE.warnings() == []


@pytest.mark.parametrize("stale_after", [sec(30), sec(20)])
def test_warns_when_stale_after_is_not_above_the_publish_interval(stale_after):
    warnings = FreshnessRule(stale_after=stale_after).warnings()
    assert len(warnings) == 1
    assert "publish interval 30s" in warnings[0]


def test_no_warning_when_stale_after_is_just_above_the_publish_interval():
    assert FreshnessRule(stale_after=sec(31)).warnings() == []


def test_warns_when_extrapolate_window_is_not_above_twice_the_interval():
    warnings = FreshnessRule(stale_after=sec(60), mode=ReferenceMode.EXTRAPOLATE).warnings()
    assert len(warnings) == 1
    assert "extrapolate" in warnings[0]


# --- properties -----------------------------------------------------------------------------

times = st.datetimes(
    min_value=datetime(2025, 12, 1), max_value=datetime(2026, 2, 1), timezones=st.just(UTC)
)
windows = st.timedeltas(min_value=timedelta(microseconds=1), max_value=timedelta(hours=2))


@quick
@given(stamp=times, newest=times, now=times, stale_after=windows)
def test_is_stale_is_exactly_stamp_before_cutoff(stamp, newest, now, stale_after):
    rule = FreshnessRule(stale_after=stale_after)
    reference = rule.reference(newest, now)
    cutoff = rule.cutoff(reference)
    assert cutoff is not None
    assert rule.is_stale(stamp, reference) == (stamp < cutoff)
    # and the reference never passes the reader's clock nor the newest stamp
    assert reference.at == min(newest, now)

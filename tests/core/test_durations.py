"""Go-syntax durations as every flag takes them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandboxctl.core.durations import format_duration, parse_duration
from sandboxctl.core.errors import InvalidValueError, SandboxctlError
from tests.core.fleet_factory import quick

# --- parsing ------------------------------------------------------------------------------


def test_seconds_parse():
    assert parse_duration("90s") == timedelta(seconds=90)


def test_minutes_and_seconds_add_up():
    assert parse_duration("1m30s") == timedelta(seconds=90)


def test_hours_parse():
    assert parse_duration("2h") == timedelta(hours=2)


def test_milliseconds_are_not_minutes():
    assert parse_duration("500ms") == timedelta(milliseconds=500)


def test_fractional_hours_parse():
    assert parse_duration("1.5h") == timedelta(minutes=90)


def test_bare_zero_needs_no_unit():
    assert parse_duration("0") == timedelta(0)


def test_negative_durations_parse():
    assert parse_duration("-90s") == timedelta(seconds=-90)
    assert parse_duration("-1m30s") == timedelta(seconds=-90)


def test_the_sign_applies_to_every_part():
    # -1h30m is minus ninety minutes, not minus one hour plus thirty minutes.
    assert parse_duration("-1h30m") == -timedelta(minutes=90)


def test_explicit_plus_sign_and_surrounding_space_are_accepted():
    assert parse_duration("+5s") == timedelta(seconds=5)
    assert parse_duration(" 90s ") == timedelta(seconds=90)


def test_every_unit_and_a_leading_dot_parse():
    assert parse_duration("1h2m3s4ms") == timedelta(hours=1, minutes=2, seconds=3, milliseconds=4)
    assert parse_duration("250us") == timedelta(microseconds=250)
    assert parse_duration("250µs") == timedelta(microseconds=250)
    assert parse_duration("2000ns") == timedelta(microseconds=2)
    assert parse_duration(".5s") == timedelta(milliseconds=500)


def test_a_bare_number_other_than_zero_is_refused_not_guessed():
    with pytest.raises(InvalidValueError) as caught:
        parse_duration("90")
    assert "'90'" in str(caught.value)


@pytest.mark.parametrize(
    "text",
    ["abc", "", "1x", "-", "h", "1h 30m", "1.2.3s", "--1s", "1s-", "s1", "90 s"],
)
def test_malformed_duration_is_refused_naming_the_input(text):
    with pytest.raises(InvalidValueError) as caught:
        parse_duration(text)
    assert repr(text) in str(caught.value)


def test_invalid_duration_is_a_value_error_and_a_sandboxctl_error():
    with pytest.raises(ValueError, match="invalid duration") as caught:
        parse_duration("1x")
    assert isinstance(caught.value, SandboxctlError)


# --- formatting ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(seconds=45), "45s"),
        (timedelta(seconds=90), "1m30s"),
        (timedelta(hours=2), "2h0m0s"),
        (timedelta(minutes=90), "1h30m0s"),
        (timedelta(milliseconds=500), "500ms"),
        (timedelta(seconds=1.5), "1.5s"),
        (timedelta(seconds=-90), "-1m30s"),
        (timedelta(hours=-2), "-2h0m0s"),
    ],
)
def test_format_duration_prints_like_go(value, text):
    assert format_duration(value) == text


@pytest.mark.parametrize("text", ["90s", "1m30s", "2h", "500ms", "1.5h", "0", "-90s", "1h2m3s4ms"])
def test_format_duration_round_trips_flag_values(text):
    value = parse_duration(text)
    assert parse_duration(format_duration(value)) == value


@quick
@given(st.integers(min_value=-360_000_000, max_value=360_000_000))
def test_format_duration_round_trips_any_whole_millisecond(millis):
    value = timedelta(milliseconds=millis)
    assert parse_duration(format_duration(value)) == value


def test_format_duration_keeps_microseconds():
    # timedelta resolves microseconds and Go prints them ("1.000001s"); the formatter must
    # not round them away, or a message can show a value other than the one in force.
    value = timedelta(seconds=1, microseconds=1)
    assert parse_duration(format_duration(value)) == value

"""RFC 3339 parsing (strict, and lenient for publishedAt) and writing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.timestamps import format_rfc3339, parse_rfc3339, parse_stamp

NINE_UTC = datetime(2026, 9, 27, 9, 0, tzinfo=UTC)

# --- parse_stamp: what publishedAt means ----------------------------------------------------


def test_missing_stamp_reads_as_unstamped():
    assert parse_stamp({}.get("publishedAt")) is None


def test_null_stamp_reads_as_unstamped():
    assert parse_stamp(None) is None


def test_empty_stamp_reads_as_unstamped():
    assert parse_stamp("") is None
    assert parse_stamp("   ") is None


def test_unparsable_stamp_reads_as_unstamped():
    assert parse_stamp("not a time") is None


def test_stamp_without_a_zone_reads_as_unstamped():
    assert parse_stamp("2026-09-27T09:00:00") is None


def test_stamp_of_the_wrong_type_reads_as_unstamped():
    assert parse_stamp(1790499600) is None


def test_utc_stamp_parses_to_an_aware_utc_datetime():
    parsed = parse_stamp("2026-09-27T09:00:00Z")
    assert parsed == NINE_UTC
    assert parsed is not None
    assert parsed.tzinfo is UTC


def test_stamp_with_an_offset_is_normalised_to_utc():
    parsed = parse_stamp("2026-09-27T11:00:00+02:00")
    assert parsed is not None
    assert parsed.tzinfo is UTC
    assert (parsed.hour, parsed.minute) == (9, 0)
    assert parsed == NINE_UTC


def test_stamp_with_fractional_seconds_parses():
    assert parse_stamp("2026-09-27T09:00:00.250Z") == NINE_UTC + timedelta(milliseconds=250)


# --- parse_rfc3339: strict --------------------------------------------------------------------


def test_strict_parse_refuses_a_time_without_zone_naming_it():
    with pytest.raises(InvalidValueError, match="zone") as caught:
        parse_rfc3339("2026-09-27T09:00:00")
    assert "'2026-09-27T09:00:00'" in str(caught.value)


def test_strict_parse_refuses_garbage_naming_it():
    with pytest.raises(InvalidValueError) as caught:
        parse_rfc3339("not a time")
    assert "'not a time'" in str(caught.value)


def test_strict_parse_normalises_offsets_to_utc():
    parsed = parse_rfc3339("2026-09-27T04:30:00-04:30")
    assert parsed == NINE_UTC
    assert parsed.tzinfo is UTC


# --- format_rfc3339 -------------------------------------------------------------------------


def test_format_writes_utc_with_z_at_second_precision():
    assert format_rfc3339(NINE_UTC) == "2026-09-27T09:00:00Z"


def test_format_converts_an_offset_time_to_utc():
    plus_two = timezone(timedelta(hours=2))
    assert format_rfc3339(datetime(2026, 9, 27, 11, 0, 5, tzinfo=plus_two)) == (
        "2026-09-27T09:00:05Z"
    )


def test_format_writes_second_precision_on_the_wire():
    # publishedAt is a metav1.Time: second precision on the wire.
    value = NINE_UTC + timedelta(milliseconds=500)
    assert format_rfc3339(value) == "2026-09-27T09:00:00Z"


def test_formatted_time_parses_back_to_the_same_instant():
    value = datetime(2026, 2, 28, 23, 59, 59, tzinfo=UTC)
    assert parse_rfc3339(format_rfc3339(value)) == value


@pytest.mark.parametrize(
    ("text", "why"),
    [("\ud800", "expected RFC 3339"), ("0001-01-01T00:00:00+01:00", "out of range in UTC")],
)
def test_strict_parse_refuses_what_no_time_can_be(text: str, why: str) -> None:
    with pytest.raises(InvalidValueError, match=why):
        parse_rfc3339(text)


def test_strict_parse_reads_lower_case_and_nine_digits_as_a_typed_decode_does():
    assert parse_rfc3339("2026-09-27t09:00:00z") == NINE_UTC
    assert parse_rfc3339("2026-09-27T09:00:00.123456789Z") == NINE_UTC + timedelta(
        microseconds=123457
    )

"""Durations in Go's syntax (``90s``, ``1m30s``, ``2h``, ``500ms``), as every flag takes them."""

from __future__ import annotations

import re
from datetime import timedelta

from sandboxctl.core.errors import InvalidValueError

_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_duration(text: str) -> timedelta:
    """Parse ``[+-]<number><unit>...`` as Go's time.ParseDuration does.

    A bare number other than ``0`` has no unit and is refused rather than guessed.
    """
    raw = text.strip()
    sign = 1.0
    body = raw
    if body[:1] in "+-" and body:
        sign = -1.0 if body[0] == "-" else 1.0
        body = body[1:]
    if body == "0":
        return timedelta(0)
    if not body:
        raise InvalidValueError(f"invalid duration {text!r}: empty")
    seconds = 0.0
    pos = 0
    for match in _PART.finditer(body):
        if match.start() != pos:
            break
        seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if pos != len(body):
        raise InvalidValueError(
            f"invalid duration {text!r}: use a number with a unit, e.g. 90s, 1m30s, 2h, 500ms"
        )
    return timedelta(seconds=sign * seconds)


def format_duration(value: timedelta) -> str:
    """Render a duration the way Go prints it, trimmed of zero parts (``1m30s``, ``-2h0m0s``)."""
    total = value.total_seconds()
    if total == 0:
        return "0s"
    sign = "-" if total < 0 else ""
    micros = round(abs(value.total_seconds()) * 1_000_000)
    if micros < 1_000:
        return f"{sign}{micros}µs"
    if micros < 1_000_000:
        return f"{sign}{_decimal(micros, 1_000)}ms"
    hours, rest = divmod(micros, 3_600_000_000)
    minutes, micros = divmod(rest, 60_000_000)
    secs = f"{_decimal(micros, 1_000_000)}s"
    if hours:
        return f"{sign}{int(hours)}h{int(minutes)}m{secs}"
    if minutes:
        return f"{sign}{int(minutes)}m{secs}"
    return f"{sign}{secs}"


def _decimal(amount: int, per_unit: int) -> str:
    """``amount / per_unit`` written exactly, without trailing zeros (1500, 1000 -> "1.5")."""
    whole, fraction = divmod(amount, per_unit)
    if not fraction:
        return str(whole)
    digits = len(str(per_unit)) - 1
    return f"{whole}.{fraction:0{digits}d}".rstrip("0")


def format_seconds(value: timedelta) -> str:
    """A duration in plain seconds, exact to the microsecond (``97.5s``, ``94.285714s``)."""
    micros = round(value.total_seconds() * 1_000_000)
    sign = "-" if micros < 0 else ""
    return f"{sign}{_decimal(abs(micros), 1_000_000)}s"

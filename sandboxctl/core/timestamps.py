"""RFC 3339 timestamps: parsing strictly, and writing them the way Kubernetes does."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import msgspec

from sandboxctl.core.errors import InvalidValueError

ZonedTime = Annotated[datetime, msgspec.Meta(tz=True)]  # what a typed decode accepts


def parse_rfc3339(text: str) -> datetime:
    """Parse an RFC 3339 timestamp; it must carry a zone (``Z`` or an offset).

    msgspec's reading first, so that a time reads the same here as where a NodeInventory
    entry is decoded typed (``core.model.Entry``: lower-case ``t`` and ``z``, and more
    than six fractional digits rounded to the microsecond); what it refuses, as
    ``datetime.fromisoformat`` reads it."""
    stripped = text.strip()
    try:
        value = _decode_time(msgspec.json.encode(stripped))  # as a JSON string, quoted
    except (msgspec.ValidationError, UnicodeEncodeError):  # a lone surrogate: not JSON
        try:
            value = datetime.fromisoformat(stripped)
        except ValueError as error:
            raise InvalidValueError(f"invalid timestamp {text!r}: expected RFC 3339") from error
    if value.tzinfo is None:
        raise InvalidValueError(f"invalid timestamp {text!r}: RFC 3339 needs a zone such as Z")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise InvalidValueError(f"invalid timestamp {text!r}: out of range in UTC") from None


_decode_time = msgspec.json.Decoder(ZonedTime).decode


def parse_stamp(value: object) -> datetime | None:
    """Read ``publishedAt``: missing, null, empty or unparsable all mean unstamped.

    A datetime (what a YAML loader makes of an unquoted timestamp) counts when it has a zone.
    """
    if isinstance(value, datetime):
        return value.astimezone(UTC) if value.tzinfo is not None else None
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        return parse_rfc3339(value)
    except InvalidValueError:
        return None


def format_rfc3339(value: datetime) -> str:
    """UTC with ``Z`` at second precision, as Kubernetes writes ``metav1.Time``."""
    if value.tzinfo is None:
        raise InvalidValueError(f"refusing to write {value.isoformat()} without a zone")
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_unix_millis(timestamp: float) -> str:
    """Unix seconds as UTC with ``Z`` at millisecond precision (e2b's log and metric times)."""
    at = datetime.fromtimestamp(timestamp, UTC)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")

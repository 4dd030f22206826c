"""RFC 3339 timestamps: parsing strictly, and writing them the way Kubernetes does."""

from __future__ import annotations

from datetime import UTC, datetime

from sandboxctl.core.errors import InvalidValueError


def parse_rfc3339(text: str) -> datetime:
    """Parse an RFC 3339 timestamp; it must carry a zone (``Z`` or an offset)."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError as error:
        raise InvalidValueError(f"invalid timestamp {text!r}: expected RFC 3339") from error
    if value.tzinfo is None:
        raise InvalidValueError(f"invalid timestamp {text!r}: RFC 3339 needs a zone such as Z")
    return value.astimezone(UTC)


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

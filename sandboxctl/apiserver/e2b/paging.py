"""``GET /v2/sandboxes``: its filters and its cursor; the store serves the pages (see
``store/pages.py``).

Sandboxes are ordered by (startedAt, sandboxID), newest first unless ``order=asc``. The
cursor (``nextToken``, answered in ``X-Next-Token``) is base64url of ``"<startedAt>
<sandboxID>"`` of the last sandbox on the page; the next page starts strictly after it,
so a sandbox that comes or goes between pages never makes the others repeat or be skipped.
"""

from __future__ import annotations

import base64
import binascii
import urllib.parse
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.ids import public_id
from sandboxctl.core.model import Entry

MAX_LIMIT: Final = 100
STATES: Final = ("running", "paused")
PAUSED_PHASES: Final = frozenset({"hibernated", "paused", "archived"})
_NEVER: Final = datetime(1970, 1, 1, tzinfo=UTC)

SortKey = tuple[datetime, str]


class BadQuery(InvalidValueError):
    """A list parameter that cannot be read; the message names it (answered 400)."""


def state_of(entry: Entry) -> str:
    return "paused" if entry.phase.lower() in PAUSED_PHASES else "running"


def sort_key(entry: Entry) -> SortKey:
    return (entry.claimed_at or _NEVER, public_id(entry.id))


# --- parameters ------------------------------------------------------------------------


def parse_metadata_filter(text: str) -> dict[str, str]:
    """The SDK's doubly encoded filter, as decoded once by the framework: split into
    ``k=v`` pairs, then percent-unquote each key and value (``user=a%20b%26c`` ->
    ``{"user": "a b&c"}``). A pair without ``=``, an empty key or a repeated key is refused."""
    found: dict[str, str] = {}
    if not text:
        return found
    for part in text.split("&"):
        if not part:
            continue
        raw_key, eq, raw_value = part.partition("=")
        if not eq:
            raise BadQuery(f"metadata filter {text!r}: {part!r} is not key=value")
        key = urllib.parse.unquote(urllib.parse.unquote_plus(raw_key))
        value = urllib.parse.unquote(urllib.parse.unquote_plus(raw_value))
        if not key:
            raise BadQuery(f"metadata filter {text!r}: empty key")
        if key in found:
            raise BadQuery(f"metadata filter {text!r}: key {key!r} given twice")
        found[key] = value
    return found


def parse_states(text: str | None) -> frozenset[str]:
    if text is None or text == "":
        return frozenset(STATES)
    states = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in states if s not in STATES]
    if bad or not states:
        raise BadQuery(f"state {text!r}: expected a comma-separated list of running, paused")
    return frozenset(states)


def parse_limit(text: str | None) -> int:
    if text is None:
        return MAX_LIMIT
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise BadQuery(f"limit {text!r}: expected a whole number from 1 to {MAX_LIMIT}")
    return int(text)


def parse_order(text: str | None) -> bool:
    """True for descending (the default)."""
    if text is None or text == "desc":
        return True
    if text == "asc":
        return False
    raise BadQuery(f"order {text!r}: expected asc or desc")


def parse_time(name: str, text: str | None) -> datetime | None:
    if text is None or text == "":
        return None
    try:
        value = datetime.fromisoformat(text.strip().replace(" ", "+"))
    except ValueError:
        raise BadQuery(f"{name} {text!r}: expected an ISO 8601 time") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)  # a naive time is read as UTC
    return value.astimezone(UTC)


def encode_cursor(key: SortKey) -> str:
    text = f"{key[0].isoformat()} {key[1]}"
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(token: str | None) -> SortKey | None:
    if token is None or token == "":
        return None
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        stamp, space, sandbox_id = raw.partition(" ")
        started = datetime.fromisoformat(stamp)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise BadQuery(f"nextToken {token!r} is not a token this server gave") from None
    if not space or not sandbox_id or started.tzinfo is None:
        raise BadQuery(f"nextToken {token!r} is not a token this server gave")
    return (started.astimezone(UTC), sandbox_id)


@dataclass(frozen=True, slots=True)
class Filters:
    states: frozenset[str] = frozenset(STATES)
    metadata: tuple[tuple[str, str], ...] = ()
    templates: frozenset[str] | None = None  # None: any template
    started_after: datetime | None = None

    def accepts(self, entry: Entry) -> bool:
        if state_of(entry) not in self.states:
            return False
        if self.templates is not None and entry.template not in self.templates:
            return False
        if self.started_after is not None and (
            entry.claimed_at is None or entry.claimed_at <= self.started_after
        ):
            return False
        if self.metadata:
            have = entry.metadata
            return all(have.get(k) == v for k, v in self.metadata)
        return True

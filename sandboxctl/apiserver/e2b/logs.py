"""e2b's sandbox logs: the query parameters of v1 and v2, which events a query selects,
and the bodies (``SandboxLog``, ``SandboxLogEntry``). The events come from the owning
agent's log of the sandbox (sandboxd's ``events.py``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from sandboxctl.agentapi import LogEvent
from sandboxctl.apiserver.e2b.paging import BadQuery
from sandboxctl.core.timestamps import format_unix_millis
from sandboxctl.core.wire import Model

LEVELS: Final = ("debug", "info", "warn", "error")
LOGGER: Final = "sandboxd"  # the logger a line names, for the CLI's --loggers filter
MAX_LIMIT: Final = 1000
MAX_SEARCH: Final = 256


@dataclass(frozen=True, slots=True)
class LogQuery:
    """From ``cursor`` (milliseconds; None: the start, or the end going backward), at
    most ``limit`` events, at least ``level``, whose message contains ``search``."""

    cursor_ms: int | None = None
    limit: int = MAX_LIMIT
    backward: bool = False
    level: str | None = None
    search: str | None = None


def parse_v1(params: Mapping[str, str]) -> LogQuery:
    """``GET /sandboxes/{id}/logs``: ``start`` (ms) and ``limit``."""
    return LogQuery(
        cursor_ms=_whole("start", params.get("start")),
        limit=_limit(params.get("limit"), cap=None),
    )


def parse_v2(params: Mapping[str, str]) -> LogQuery:
    """``GET /v2/sandboxes/{id}/logs``: ``cursor`` (ms), ``limit`` (0..1000),
    ``direction`` (forward, backward), ``level`` (a minimum) and ``search``."""
    direction = params.get("direction") or "forward"
    if direction not in ("forward", "backward"):
        raise BadQuery(f"direction {direction!r}: expected forward or backward")
    level = params.get("level") or None
    if level is not None and level not in LEVELS:
        raise BadQuery(f"level {level!r}: expected one of {', '.join(LEVELS)}")
    search = params.get("search") or None
    if search is not None and len(search) > MAX_SEARCH:
        raise BadQuery(f"search: at most {MAX_SEARCH} characters")
    return LogQuery(
        cursor_ms=_whole("cursor", params.get("cursor")),
        limit=_limit(params.get("limit"), cap=MAX_LIMIT),
        backward=direction == "backward",
        level=level,
        search=search,
    )


def select(events: Sequence[LogEvent], query: LogQuery) -> list[LogEvent]:
    """The events a query asks for, in its direction (oldest first going forward)."""
    floor = LEVELS.index(query.level) if query.level else 0
    ordered = reversed(events) if query.backward else iter(events)
    chosen: list[LogEvent] = []
    for event in ordered:
        if len(chosen) >= query.limit:
            break
        ms = int(event.timestamp * 1000)
        if query.cursor_ms is not None and (
            ms > query.cursor_ms if query.backward else ms < query.cursor_ms
        ):
            continue
        if _rank(event.level) < floor:
            continue
        if query.search is not None and query.search not in event.message:
            continue
        chosen.append(event)
    return chosen


class SandboxLogEntry(Model, frozen=True):
    timestamp: str
    level: str
    message: str
    fields: dict[str, str]

    @classmethod
    def of(cls, event: LogEvent) -> SandboxLogEntry:
        level = event.level if event.level in LEVELS else "info"
        return cls(format_unix_millis(event.timestamp), level, event.message, event.fields)


class SandboxLogLine(Model, frozen=True):
    """One ``SandboxLog``: v1's line is a JSON object, as upstream's are (the e2b CLI
    parses it and reads its ``level`` and ``logger``)."""

    timestamp: str
    line: str

    @classmethod
    def of(cls, event: LogEvent) -> SandboxLogLine:
        line = {
            **event.fields,
            "level": event.level,
            "logger": event.fields.get("logger", LOGGER),
            "message": event.message,
        }
        return cls(format_unix_millis(event.timestamp), json.dumps(line))


class SandboxLogs(Model, frozen=True):
    """``GET /sandboxes/{id}/logs``: the lines and the entries of the same events."""

    logs: tuple[SandboxLogLine, ...]
    logEntries: tuple[SandboxLogEntry, ...]


class SandboxLogsV2(Model, frozen=True):
    """``GET /v2/sandboxes/{id}/logs``."""

    logs: tuple[SandboxLogEntry, ...]


def _rank(level: str) -> int:
    return LEVELS.index(level) if level in LEVELS else LEVELS.index("info")


def _whole(name: str, text: str | None) -> int | None:
    if text is None or text == "":
        return None
    if not text.isascii() or not text.isdigit():
        raise BadQuery(f"{name} {text!r}: expected milliseconds since the epoch, a whole number")
    return int(text)


def _limit(text: str | None, cap: int | None) -> int:
    if text is None or text == "":
        return MAX_LIMIT
    if not text.isascii() or not text.isdigit() or (cap is not None and int(text) > cap):
        bound = f"0 to {cap}" if cap is not None else "0 up"
        raise BadQuery(f"limit {text!r}: expected a whole number from {bound}")
    return int(text)

"""Clocks passed into services, so tests move time instead of sleeping."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Wall-clock time, timezone-aware UTC."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to; wall and monotonic time move together."""

    def __init__(self, start: datetime, monotonic: float = 1000.0) -> None:
        self._now = start
        self._monotonic = monotonic

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, by: timedelta | float) -> None:
        step = by if isinstance(by, timedelta) else timedelta(seconds=by)
        self._now += step
        self._monotonic += step.total_seconds()

"""The one periodic loop: a step run every interval until a stop.

The interval counts from the start of one run to the start of the next, so a slow step
does not drift the cadence (a step longer than the interval is followed at once); with
``from_end`` it counts from the end of a run instead, so every run is followed by a full
interval (a poll that must not go back to back when its rounds are slow). The first run
is at once or after one interval. :meth:`Loop.wake` runs the step now (an event
arrived); a stop ends any wait at once, never a sleep that ignores it. A step that
raises is logged and the loop goes on: one bad round must not end a service.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from sandboxctl.lifecycle.stop import Stop

log = logging.getLogger(__name__)


class Loop:
    def __init__(
        self,
        name: str,
        step: Callable[[], object],
        interval: timedelta,
        *,
        immediately: bool = True,
        spacing: timedelta = timedelta(0),
        from_end: bool = False,
        logger: logging.Logger = log,
        failed: str = "",
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``spacing``: the least time between two runs, woken or not (a burst of events
        is one run). ``from_end``: count the interval from the end of a run, not its
        start. ``failed``: the line logged with the traceback of a failed step
        (default ``"<name> failed"``)."""
        self.name = name
        self._step = step
        self._interval = interval.total_seconds()
        self._immediately = immediately
        self._spacing = spacing.total_seconds()
        self._from_end = from_end
        self._log = logger
        self._failed = failed or f"{name} failed"
        self._monotonic = monotonic
        self._wake = threading.Event()

    def wake(self) -> None:
        """Run the step as soon as the spacing allows (safe from a signal handler)."""
        self._wake.set()

    def run(self, stop: Stop) -> None:
        stop.on_set(self._wake.set)  # a stop ends the wait at once
        due = self._monotonic() + (0.0 if self._immediately else self._interval)
        while not stop.is_set():
            self._wake.wait(max(0.0, due - self._monotonic()))
            if stop.is_set():
                return
            self._wake.clear()
            started = self._monotonic()
            try:
                self._step()
            except Exception:
                self._log.exception(self._failed)
            due = (self._monotonic() if self._from_end else started) + self._interval
            if self._spacing:
                stop.wait(self._spacing)

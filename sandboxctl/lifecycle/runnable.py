"""What the process manager runs: a :class:`Runnable` runs until its stop is set, then
returns; and :class:`Background`, one runnable on a thread of its own, for a part used
outside a manager (a test, a verb that reads a cache once)."""

from __future__ import annotations

import threading
from typing import Protocol

from sandboxctl.lifecycle.stop import Stop

JOIN_TIMEOUT = 10.0


class Runnable(Protocol):
    """Runs on a thread of its own until ``stop`` is set, then returns promptly. Raising
    (or returning before the stop) is a failure of the whole process. Whether it needs
    leader election is the group it is added to (``Group.LEADER_ELECTED``)."""

    @property
    def name(self) -> str: ...

    def run(self, stop: Stop) -> None: ...


class Background:
    """``runnable`` on a daemon thread from :meth:`start` to :meth:`stop`; it may be
    started again after a stop (a leader that lost its lease and won it back)."""

    def __init__(self, runnable: Runnable, join_timeout: float = JOIN_TIMEOUT) -> None:
        self.runnable = runnable
        self._join_timeout = join_timeout
        self._stop = Stop()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def stopping(self) -> Stop:
        """The current run's stop."""
        return self._stop

    def start(self) -> None:
        if self.running:
            raise RuntimeError(f"{self.runnable.name} is already running")
        self._stop = Stop()
        self._thread = threading.Thread(
            target=self.runnable.run, args=(self._stop,), name=self.runnable.name, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Set the stop and wait (bounded) for the run to return; safe from the run's own
        thread (it does not wait then) and before any start."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self._join_timeout)

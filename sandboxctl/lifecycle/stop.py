"""A stop asked for once and seen by every part of a process, like a Go context's Done:
a part waits on it, polls it, or has a callback run the moment it is set (a loop's wait
ends, a server is told to exit, a watch stream is closed)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Stop:
    def __init__(self) -> None:
        self._event = threading.Event()
        # Re-entrant: a signal handler on the main thread may set it while that thread
        # holds the lock.
        self._lock = threading.RLock()
        self._callbacks: list[Callable[[], None]] = []

    def set(self) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # one part's failure to stop must not keep the rest running
                log.exception("a stop callback failed")

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """True once set; False when ``timeout`` seconds passed first."""
        return self._event.wait(timeout)

    def on_set(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the stop is set (at once when it already is)."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return
        callback()

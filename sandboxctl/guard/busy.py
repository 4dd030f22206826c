"""Where the guard learns which workers are busy: the ``BusySource`` protocol and the
sources that need no network of their own.

A source answers from memory (``reading`` is called for every pod on every tick and
must not block); whatever it polls, it polls on its own thread, and it calls ``changed``
when a reading may have flipped so the reconciler runs at once instead of at its next
tick. ``UNKNOWN`` means "do not change anything on my account".

* ``AnnotationSource`` (``--busy-source annotation=KEY``): workers report on their own
  pod; a positive count, ``true`` or ``busy`` is busy; ``0``, ``false``, ``idle`` or no
  annotation is idle; anything else is unknown. The pod's events already wake the
  reconciler, so this source needs no thread;
* ``CountingSource``: sessions counted in this process (an embedder's acquire and
  release), clamped at zero so a release without an acquire cannot underflow.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from sandboxctl.guard.decide import Busy
from sandboxctl.guard.pods import PodView

log = logging.getLogger(__name__)

Changed = Callable[[], None]

_BUSY_WORDS = frozenset({"true", "busy"})
_IDLE_WORDS = frozenset({"false", "idle", ""})


class BusySource(Protocol):
    name: str

    def start(self, changed: Changed) -> None: ...

    def stop(self) -> None: ...

    def wait_synced(self, timeout: float) -> bool:
        """True once the source has read the world at least once."""
        ...

    def reading(self, pod: PodView) -> Busy: ...

    def detail(self, pod: PodView) -> str:
        """What the reading rests on, for ``status`` (``"3 sessions"``)."""
        ...


def ignore_change() -> None:
    return None


class MemorySource:
    """A source that reads only memory: nothing to start, stop or sync."""

    def start(self, changed: Changed) -> None:
        return None

    def stop(self) -> None:
        return None

    def wait_synced(self, timeout: float) -> bool:
        return True


class AnnotationSource(MemorySource):
    def __init__(self, key: str) -> None:
        self.name = f"annotation={key}"
        self.key = key

    def reading(self, pod: PodView) -> Busy:
        return self.read(pod.annotations.get(self.key))

    def detail(self, pod: PodView) -> str:
        value = pod.annotations.get(self.key)
        return f"{self.key}={value}" if value is not None else f"no {self.key}"

    @staticmethod
    def read(value: str | None) -> Busy:
        if value is None:
            return Busy.IDLE
        text = value.strip().lower()
        if text in _BUSY_WORDS:
            return Busy.BUSY
        if text in _IDLE_WORDS:
            return Busy.IDLE
        try:
            count = int(text)
        except ValueError:
            return Busy.UNKNOWN
        return Busy.BUSY if count > 0 else Busy.IDLE


class CountingSource(MemorySource):
    """Sessions counted in process, by pod (``namespace/name``). The lock guards only the
    counts: no call to the API server ever runs under it."""

    name = "sessions (in process)"

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._changed: Changed = ignore_change

    def start(self, changed: Changed) -> None:
        self._changed = changed

    def stop(self) -> None:
        self._changed = ignore_change

    def acquire(self, pod: str) -> int:
        with self.lock:
            count = self._counts.get(pod, 0) + 1
            self._counts[pod] = count
        if count == 1:
            self._changed()
        return count

    def release(self, pod: str) -> int:
        with self.lock:
            before = self._counts.get(pod, 0)
            count = max(0, before - 1)
            self._counts[pod] = count
        if before == 0:
            log.warning("event=release-without-acquire pod=%s (count stays 0)", pod)
        elif count == 0:
            self._changed()
        return count

    def count(self, pod: str) -> int:
        with self.lock:
            return self._counts.get(pod, 0)

    def reading(self, pod: PodView) -> Busy:
        return Busy.BUSY if self._counts.get(f"{pod.namespace}/{pod.name}", 0) > 0 else Busy.IDLE

    def detail(self, pod: PodView) -> str:
        return f"{self._counts.get(f'{pod.namespace}/{pod.name}', 0)} sessions"

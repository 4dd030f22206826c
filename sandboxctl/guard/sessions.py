"""``--busy-source sessions=URL``: an endpoint answering ``{pod: count}``.

Polled on its own thread every ``interval``. Keys are a pod's ``name`` (any namespace) or
``namespace/name``; a pod the answer does not name has no sessions. A negative count is
read as 0 and logged (a release without its acquire must not make a worker look busy, or
idle, forever). While the last poll failed every reading is ``UNKNOWN``: the guard
changes nothing on stale data, so a sessions outage neither stamps nor clears.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from datetime import timedelta

import httpx

from sandboxctl.guard.busy import Changed, ignore_change
from sandboxctl.guard.decide import Busy
from sandboxctl.guard.pods import PodView
from sandboxctl.lifecycle import Background, Loop

log = logging.getLogger(__name__)


class SessionsAnswerError(ValueError):
    pass


def read_counts(answer: object) -> dict[str, int]:
    """The answer as counts; SessionsAnswerError when it is not ``{string: count}``."""
    if not isinstance(answer, dict):
        raise SessionsAnswerError("expected a JSON object {pod: count}")
    counts: dict[str, int] = {}
    for key, value in answer.items():
        if isinstance(value, bool):
            count = int(value)
        elif isinstance(value, int):
            count = value
        else:
            raise SessionsAnswerError(f"{key!r}: expected an integer count, got {value!r}")
        if count < 0:
            log.warning("event=negative-count pod=%s count=%d (read as 0)", key, count)
            count = 0
        counts[str(key)] = count
    return counts


class SessionsSource:
    def __init__(
        self, url: str, interval: float, timeout: float, client: httpx.Client | None = None
    ) -> None:
        self.name = f"sessions={url}"
        self.url = url
        self.interval = interval
        self._client = client or httpx.Client(timeout=timeout)
        self._counts: Mapping[str, int] = {}
        self._ok = False
        self._synced = threading.Event()
        self._background = Background(
            Loop(
                "guard-sessions",
                self._round,
                timedelta(seconds=interval),
                from_end=True,  # a full interval after each poll, however long it took
                logger=log,
            )
        )
        self._changed: Changed = ignore_change
        self.polls = 0
        self.failures = 0
        self.last_error = ""

    def start(self, changed: Changed) -> None:
        self._changed = changed
        self._background.start()

    def stop(self) -> None:
        self._background.stop()
        self._client.close()

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    def poll(self) -> bool:
        """One read of the endpoint; True when the readings changed."""
        self.polls += 1
        try:
            response = self._client.get(self.url)
            response.raise_for_status()
            counts = read_counts(response.json())
        except (httpx.HTTPError, ValueError) as error:
            self.failures += 1
            text = " ".join(f"{type(error).__name__}: {error}".split())
            if self._ok or text != self.last_error:
                log.warning("event=sessions-unreadable url=%s error=%r", self.url, text)
            self.last_error = text
            changed = self._ok
            self._ok = False
            return changed
        changed = not self._ok or _busy_set(counts) != _busy_set(self._counts)
        self._counts = counts
        self._ok = True
        self.last_error = ""
        self._synced.set()
        return changed

    def _round(self) -> None:
        if self.poll():
            self._changed()

    def _count(self, pod: PodView) -> int | None:
        counts = self._counts
        found = counts.get(f"{pod.namespace}/{pod.name}")
        return found if found is not None else counts.get(pod.name)

    def reading(self, pod: PodView) -> Busy:
        if not self._ok:
            return Busy.UNKNOWN
        return Busy.BUSY if (self._count(pod) or 0) > 0 else Busy.IDLE

    def detail(self, pod: PodView) -> str:
        if not self._ok:
            return f"sessions unknown ({self.last_error or 'not read yet'})"
        return f"{self._count(pod) or 0} sessions"


def _busy_set(counts: Mapping[str, int]) -> frozenset[str]:
    return frozenset(key for key, count in counts.items() if count > 0)

"""Each sandbox's log: its lifecycle and what envd did in it, bounded per sandbox.

The agent records a sandbox's start, claim, pause, resume, expiry and kill, and envd the
commands it started and how they ended. Each sandbox keeps its newest ``per_sandbox``
events; the log of a destroyed sandbox is kept too (its kill is in it), for the newest
``keep_gone`` destroyed sandboxes, so memory stays bounded whatever the churn.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from sandboxctl.agentapi.models import LogEvent

DEFAULT_PER_SANDBOX = 1000
DEFAULT_KEEP_GONE = 256
LEVELS = ("debug", "info", "warn", "error")


@dataclass(slots=True)
class _Log:
    claim_ref: str
    events: deque[LogEvent]


class EventLog:
    """Thread-safe; ``now`` gives unix seconds (injected in tests)."""

    def __init__(
        self,
        per_sandbox: int = DEFAULT_PER_SANDBOX,
        keep_gone: int = DEFAULT_KEEP_GONE,
        now: Callable[[], float] = time.time,
    ) -> None:
        self._per_sandbox = per_sandbox
        self._keep_gone = keep_gone
        self._now = now
        self._lock = threading.Lock()
        self._live: dict[str, _Log] = {}
        self._gone: OrderedDict[str, _Log] = OrderedDict()

    def record(
        self,
        sandbox_id: str,
        message: str,
        level: str = "info",
        claim_ref: str | None = None,
        **fields: str,
    ) -> None:
        """Add an event; ``claim_ref`` (set by the claim) says whose log it is."""
        event = LogEvent(self._now(), level, message, {"sandboxID": sandbox_id, **fields})
        with self._lock:
            log = self._live.get(sandbox_id) or self._gone.get(sandbox_id)
            if log is None:
                log = self._live[sandbox_id] = _Log("", deque(maxlen=self._per_sandbox))
            if claim_ref is not None:
                log.claim_ref = claim_ref
            log.events.append(event)

    def gone(self, sandbox_id: str) -> None:
        """The sandbox was destroyed: keep its log among the newest ``keep_gone``."""
        with self._lock:
            log = self._live.pop(sandbox_id, None)
            if log is None:
                return
            if not log.claim_ref:  # a warm sandbox nobody claimed: nobody will ask
                return
            self._gone[sandbox_id] = log
            while len(self._gone) > self._keep_gone:
                self._gone.popitem(last=False)

    def events(self, sandbox_id: str) -> tuple[str, list[LogEvent]] | None:
        """(claim_ref, events oldest first) of a claimed sandbox, live or destroyed;
        None when there is no such log."""
        with self._lock:
            log = self._live.get(sandbox_id) or self._gone.get(sandbox_id)
            if log is None or not log.claim_ref:
                return None
            return log.claim_ref, list(log.events)

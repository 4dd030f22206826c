"""The process manager every long-lived command runs its parts under, after
controller-runtime's Manager.

Parts are :class:`Runnable` s added to a :class:`Group`. :meth:`Manager.run` starts the
groups in order, each part on a thread of its own: the servers, then the other parts,
then the election when there is one; the leader-elected parts start each time this
process wins the Lease and stop when it loses it (the process goes on and campaigns
again; a part that does not stop within the grace period then fails the process, and is
never started again while its first run is alive). A source that must have synced before
anything serves (the kube inventory) is started, and waited for, before the manager
runs: its failure is a start-up error (one line, exit 2). It returns when a stop is
asked (:meth:`Manager.stop`, SIGINT or SIGTERM) or a part fails (raises, or returns
before the stop), after stopping the groups in reverse order within one grace period;
its result is the exit code.

Entered as a context manager it takes SIGINT and SIGTERM on the main thread until it is
left: the first asks the orderly stop; another one, once the stop has begun (the caller's
own teardown after :meth:`run` included), ends the process at once with 128 + the
signal's number, as the signal's default action would.
"""

from __future__ import annotations

import enum
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from types import FrameType, TracebackType
from typing import Self

from sandboxctl.lifecycle.runnable import Runnable
from sandboxctl.lifecycle.stop import Stop

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
GRACE = timedelta(seconds=30)
EXIT_STOPPED = 0
EXIT_FAILED = 1

# The election: given what to call on winning and on losing the Lease, the runnable that
# campaigns (kube.LeaderElector). A factory, so this package needs no Kubernetes client.
Election = Callable[[Callable[[], None], Callable[[], None]], Runnable]


class Group(enum.IntEnum):
    """Start order; stopped in reverse."""

    SERVERS = 0
    OTHERS = 1
    LEADER_ELECTED = 2


@dataclass
class _Running:
    """One group's parts while they run: their threads and the group's stop."""

    stop: Stop = field(default_factory=Stop)
    threads: list[threading.Thread] = field(default_factory=list)


class Manager:
    def __init__(
        self,
        *,
        grace: timedelta = GRACE,
        election: Election | None = None,
        signals: tuple[signal.Signals, ...] = STOP_SIGNALS,
    ) -> None:
        """``signals``: what asks the orderly stop once the manager is entered."""
        self._signals = signals
        self._grace = grace.total_seconds()
        self._election = election
        self._parts: dict[Group, list[Runnable]] = {group: [] for group in Group}
        self._running: dict[Group, _Running] = {}
        self._leading_lock = threading.Lock()
        self.stopping = Stop()  # set when the orderly stop begins, whatever asked it
        self._failures: list[str] = []
        self._previous: dict[int, object] = {}
        self._deadline = math.inf  # the end of the grace, once the stop is under way

    def add(self, runnable: Runnable, group: Group = Group.OTHERS) -> None:
        if group is Group.LEADER_ELECTED and self._election is None:
            raise ValueError(f"{runnable.name} needs leader election, and there is none")
        self._parts[group].append(runnable)

    def stop(self) -> None:
        """Ask the orderly stop (safe from a signal handler and from any thread)."""
        self.stopping.set()

    # --- signals ----------------------------------------------------------------------

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            for sig in self._signals:
                self._previous[sig] = signal.signal(sig, self._signalled)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _signalled(self, signum: int, frame: FrameType | None) -> None:
        if self.stopping.is_set():
            os._exit(128 + signum)  # a second signal: no waiting for anything
        log.debug("stopping (%s)", signal.Signals(signum).name)
        self.stop()

    # --- running ----------------------------------------------------------------------

    def run(self) -> int:
        """Run every part until a stop is asked or one fails; then stop them all in
        reverse order. 0 after an asked stop, 1 after a failure or a grace exceeded."""
        try:
            self._start_all()
            self.stopping.wait()
        finally:
            self._deadline = time.monotonic() + self._grace
            self.stopping.set()
            in_time = self._stop_all(self._deadline)
        if self._failures:
            log.error("stopped after a failure: %s", "; ".join(self._failures))
            return EXIT_FAILED
        return EXIT_STOPPED if in_time else EXIT_FAILED

    def _start_all(self) -> None:
        for group in (Group.SERVERS, Group.OTHERS):
            self._start(group)
        if self._election is not None:
            elector = self._election(self._lead, self._follow)
            self._running[Group.LEADER_ELECTED] = _Running()  # empty until this leads
            self._parts[Group.OTHERS].append(elector)
            self._launch(self._running[Group.OTHERS], elector)

    def _start(self, group: Group) -> None:
        running = self._running.setdefault(group, _Running())
        for part in self._parts[group]:
            if self.stopping.is_set():
                return
            self._launch(running, part)

    def _launch(self, running: _Running, part: Runnable) -> None:
        thread = threading.Thread(
            target=self._guarded, args=(part, running.stop), name=part.name, daemon=True
        )
        running.threads.append(thread)
        thread.start()

    def _guarded(self, part: Runnable, stop: Stop) -> None:
        """One part's thread: its failure, or an end before its stop, stops the process."""
        try:
            part.run(stop)
        except BaseException as error:  # SystemExit too: uvicorn's way to fail a start
            log.exception("%s failed", part.name)
            self._fail(f"{part.name}: {error!r}")
            return
        if not stop.is_set():
            self._fail(f"{part.name} ended before a stop was asked")

    def _fail(self, why: str) -> None:
        self._failures.append(why)
        self.stopping.set()

    # --- leader election ----------------------------------------------------------------

    def _lead(self) -> None:
        with self._leading_lock:
            if self.stopping.is_set():
                return
            previous = self._running.get(Group.LEADER_ELECTED)
            alive = [t.name for t in previous.threads if t.is_alive()] if previous else []
            if alive:  # never two runs of one part at once
                log.error("leading again while %s still run", ", ".join(alive))
                self._fail(f"{', '.join(alive)} still ran when the Lease was won again")
                return
            log.info("leading: starting %d parts", len(self._parts[Group.LEADER_ELECTED]))
            running = self._running[Group.LEADER_ELECTED] = _Running()
            for part in self._parts[Group.LEADER_ELECTED]:
                self._launch(running, part)

    def _follow(self) -> None:
        """The Lease is lost (or handed back): the leader-elected parts stop; the rest
        goes on, and the election campaigns again. A part that does not stop within the
        grace is a failure of the process (it may still write without the Lease), and its
        run stays recorded so that it is never started again while it is alive.

        The join holds no lock (a stop of the process must not wait for it) and ends by
        the stop's own deadline once one is under way."""
        with self._leading_lock:
            running = self._running.get(Group.LEADER_ELECTED)
            if running is None or not running.threads:
                return
            running.stop.set()
        late = _join(running.threads, min(time.monotonic() + self._grace, self._deadline))
        if late:
            for name in late:
                log.error("%s did not stop within the grace period after the Lease was lost", name)
            self._fail(f"{', '.join(late)} did not stop within the grace after the Lease was lost")
            return
        with self._leading_lock:
            if self._running.get(Group.LEADER_ELECTED) is running:
                self._running[Group.LEADER_ELECTED] = _Running()

    # --- stopping -----------------------------------------------------------------------

    def _stop_all(self, deadline: float) -> bool:
        """Stop the groups in reverse order; False when one outlived the grace."""
        in_time = True
        for group in sorted(self._running, reverse=True):
            with self._leading_lock:  # no election hands over while a group stops
                running = self._running[group]
                running.stop.set()
            late = _join(running.threads, deadline)
            for name in late:
                log.error("%s did not stop within the grace period", name)
            in_time = in_time and not late
        return in_time


def _join(threads: list[threading.Thread], deadline: float) -> list[str]:
    """Wait for ``threads`` until ``deadline``; the names of those still running."""
    for thread in threads:
        if thread is not threading.current_thread():
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
    return [thread.name for thread in threads if thread.is_alive()]

"""The one periodic loop: first run at once or after the interval, a failing step logged
and the loop going on, a wake running the step now, and a stop ending any wait at once."""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import pytest

from sandboxctl.lifecycle import Background, Loop, Stop
from tests.sandboxd.servers import wait_until

LONG = timedelta(hours=1)


class Steps:
    def __init__(self, fail_first: int = 0) -> None:
        self.count = 0
        self._fail_first = fail_first

    def __call__(self) -> None:
        self.count += 1
        if self.count <= self._fail_first:
            raise RuntimeError(f"bad round {self.count}")


def test_the_first_run_is_at_once_and_a_stop_ends_the_wait_promptly() -> None:
    steps = Steps()
    running = Background(Loop("counting", steps, LONG))
    running.start()
    wait_until(lambda: steps.count == 1, timeout=5, what="the first run")
    began = time.monotonic()
    running.stop()
    assert not running.running
    assert time.monotonic() - began < 1.0  # not the hour's interval
    assert steps.count == 1


def test_a_loop_that_starts_later_waits_one_interval_first() -> None:
    steps = Steps()
    stop = Stop()
    loop = Loop("later", steps, timedelta(milliseconds=300), immediately=False)
    thread = threading.Thread(target=loop.run, args=(stop,))
    began = time.monotonic()
    thread.start()
    wait_until(lambda: steps.count >= 1, timeout=5, what="the first run")
    assert time.monotonic() - began >= 0.3
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_a_failing_step_is_logged_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    steps = Steps(fail_first=2)
    running = Background(
        Loop("flaky", steps, timedelta(milliseconds=20), failed="flaky round failed")
    )
    with caplog.at_level(logging.ERROR):
        running.start()
        wait_until(lambda: steps.count >= 4, timeout=5, what="runs after two failures")
        running.stop()
    failures = [r for r in caplog.records if r.getMessage() == "flaky round failed"]
    assert len(failures) == 2
    assert all(r.exc_info is not None for r in failures)


def test_a_wake_runs_the_step_now() -> None:
    steps = Steps()
    loop = Loop("woken", steps, LONG)
    running = Background(loop)
    running.start()
    wait_until(lambda: steps.count == 1, timeout=5, what="the first run")
    loop.wake()
    wait_until(lambda: steps.count == 2, timeout=5, what="the woken run")
    running.stop()


def test_a_stop_set_before_the_run_returns_at_once_without_a_step() -> None:
    steps = Steps()
    stop = Stop()
    stop.set()
    Loop("never", steps, LONG).run(stop)
    assert steps.count == 0


def test_from_end_a_step_longer_than_the_interval_is_followed_by_a_full_interval() -> None:
    """The first step takes an hour by the loop's clock (injected): counted from its end,
    the next one still waits the interval (counted from its start it would run at once)."""
    interval = 0.3
    offset = [0.0]
    entries: list[float] = []
    exits: list[float] = []

    def step() -> None:
        entries.append(time.monotonic())
        if len(entries) == 1:
            offset[0] += 3600.0  # a round far longer than the interval
        exits.append(time.monotonic())

    stop = Stop()
    loop = Loop(
        "polls",
        step,
        timedelta(seconds=interval),
        from_end=True,
        monotonic=lambda: time.monotonic() + offset[0],
    )
    thread = threading.Thread(target=loop.run, args=(stop,))
    thread.start()
    try:
        wait_until(lambda: len(entries) >= 2, timeout=5, what="the second run")
    finally:
        stop.set()
        thread.join(timeout=5)
    assert entries[1] - exits[0] >= interval

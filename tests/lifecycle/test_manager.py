"""The process manager: groups start in order (servers, others) and stop in reverse; a
signal is an orderly stop with exit 0; a failing part stops the rest with exit 1; a part
that outlives the grace is an error; the leader-elected group starts only once this
process holds the Lease (against the Kubernetes API double)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import pytest

from sandboxctl.kube import LeaderElector
from sandboxctl.lifecycle import EXIT_FAILED, EXIT_STOPPED, Group, Manager, Stop
from tests.lifecycle.managed import Managed
from tests.sandboxd.servers import wait_until
from tests.testing.kubeapi.double import Kube


class Journal:
    """What the parts did, in order, from every thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.entries: list[str] = []

    def add(self, entry: str) -> None:
        with self._lock:
            self.entries.append(entry)

    def has(self, entry: str) -> bool:
        with self._lock:
            return entry in self.entries


class Part:
    def __init__(self, name: str, journal: Journal, fail: Exception | None = None) -> None:
        self.name = name
        self._journal = journal
        self._fail = fail

    def run(self, stop: Stop) -> None:
        self._journal.add(f"start {self.name}")
        if self._fail is not None:
            raise self._fail
        stop.wait()
        self._journal.add(f"stop {self.name}")


class Stubborn(Part):
    """Ignores its stop until released."""

    def __init__(self, name: str, journal: Journal) -> None:
        super().__init__(name, journal)
        self.release = threading.Event()

    def run(self, stop: Stop) -> None:
        self.release.wait()


def run_in_background(manager: Manager) -> tuple[threading.Thread, list[int]]:
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(manager.run()))
    thread.start()
    return thread, codes


def test_groups_start_in_order_and_stop_in_reverse() -> None:
    journal = Journal()
    manager = Manager()
    manager.add(Part("other", journal))  # added first, started after the servers
    manager.add(Part("server", journal), Group.SERVERS)
    thread, codes = run_in_background(manager)
    wait_until(lambda: journal.has("start other"), timeout=5, what="the others' start")
    assert journal.entries == ["start server", "start other"]
    manager.stop()
    thread.join(timeout=10)
    assert codes == [EXIT_STOPPED]
    assert journal.entries[2:] == ["stop other", "stop server"]


def test_a_stop_signal_is_an_orderly_stop_with_exit_0() -> None:
    journal = Journal()
    with Manager() as manager:
        manager.add(Part("server", journal), Group.SERVERS)
        manager.add(Part("other", journal))
        # The signal arrives on the main thread once both parts run.
        threading.Thread(
            target=lambda: (
                wait_until(lambda: journal.has("start other"), timeout=5, what="the start"),
                os.kill(os.getpid(), signal.SIGTERM),
            )
        ).start()
        code = manager.run()
    assert code == EXIT_STOPPED
    assert journal.entries[2:] == ["stop other", "stop server"]
    assert signal.getsignal(signal.SIGTERM) is not manager._signalled  # handed back


def test_a_failing_part_stops_the_rest_and_the_exit_is_1(caplog: pytest.LogCaptureFixture) -> None:
    journal = Journal()
    manager = Manager()
    manager.add(Part("server", journal), Group.SERVERS)
    manager.add(Part("broken", journal, fail=RuntimeError("no disk")))
    assert manager.run() == EXIT_FAILED
    assert journal.entries[-1] == "stop server"
    assert "broken: RuntimeError('no disk')" in caplog.text


def test_a_part_that_returns_before_a_stop_is_a_failure() -> None:
    manager = Manager()
    manager.add(Returns("quitter"))
    assert manager.run() == EXIT_FAILED


class Returns:
    def __init__(self, name: str) -> None:
        self.name = name

    def run(self, stop: Stop) -> None:
        return


def test_a_part_that_outlives_the_grace_is_an_error_exit() -> None:
    journal = Journal()
    stubborn = Stubborn("stubborn", journal)
    manager = Manager(grace=timedelta(milliseconds=200))
    manager.add(stubborn)
    thread, codes = run_in_background(manager)
    manager.stop()
    thread.join(timeout=5)
    stubborn.release.set()
    assert codes == [EXIT_FAILED]


FAST = {
    "lease_duration": timedelta(seconds=1.5),
    "renew_deadline": timedelta(seconds=1.0),
    "retry_period": timedelta(seconds=0.2),
    "rejoin_after": timedelta(seconds=0.5),
}


def election(kube: Kube, identity: str) -> Callable[..., LeaderElector]:
    def elector(on_started: Callable[[], None], on_stopped: Callable[[], None]) -> LeaderElector:
        return LeaderElector(
            kube.api, "sandbox-system", "lifecycle-test", identity, on_started, on_stopped, **FAST
        )

    return elector


def test_the_leader_elected_group_starts_only_once_this_process_leads(kube: Kube) -> None:
    held = LeaderElector(
        kube.api, "sandbox-system", "lifecycle-test", "other", lambda: None, lambda: None, **FAST
    )
    other = Managed(held)  # the other replica's process
    other.start()
    wait_until(lambda: held.is_leader, timeout=10, what="the other replica's lead")
    journal = Journal()
    manager = Manager(election=election(kube, "this"))
    manager.add(Part("other", journal))
    manager.add(Part("driver", journal), Group.LEADER_ELECTED)
    thread, codes = run_in_background(manager)
    try:
        wait_until(lambda: journal.has("start other"), timeout=5, what="the others' start")
        stop_waiting = Stop()
        stop_waiting.wait(1.0)  # five retry periods while the other replica leads
        assert not journal.has("start driver")
        other.stop()  # hands the lease back
        wait_until(lambda: journal.has("start driver"), timeout=10, what="the driver's start")
    finally:
        other.stop()
        manager.stop()
        thread.join(timeout=15)
    assert codes == [EXIT_STOPPED]
    assert journal.entries[-2:] == ["stop driver", "stop other"]


class Election:
    """An election the test drives: ``lead`` wins the Lease, ``follow`` loses it; a stop
    of a leader hands it back (``on_stopped``), as LeaderElector does."""

    name = "election"

    def __init__(self) -> None:
        self.commands: queue.Queue[str] = queue.Queue()

    def __call__(self, on_started: Callable[[], None], on_stopped: Callable[[], None]) -> Election:
        self._on_started, self._on_stopped = on_started, on_stopped
        return self

    def run(self, stop: Stop) -> None:
        stop.on_set(lambda: self.commands.put("stop"))
        leading = False
        while (command := self.commands.get()) != "stop":
            leading = command == "lead"
            (self._on_started if leading else self._on_stopped)()
        if leading:
            self._on_stopped()


class Counted(Stubborn):
    """Ignores its stop until released; counts its runs and notes when a stop is asked."""

    def __init__(self, name: str, journal: Journal) -> None:
        super().__init__(name, journal)
        self.runs = 0
        self.asked = threading.Event()

    def run(self, stop: Stop) -> None:
        self.runs += 1
        stop.on_set(self.asked.set)
        super().run(stop)


def test_a_leader_elected_part_that_outlives_the_grace_fails_and_never_runs_twice(
    caplog: pytest.LogCaptureFixture,
) -> None:
    elect = Election()
    stubborn = Counted("driver", Journal())
    manager = Manager(grace=timedelta(milliseconds=200), election=elect)
    manager.add(stubborn, Group.LEADER_ELECTED)
    thread, codes = run_in_background(manager)
    try:
        elect.commands.put("lead")
        wait_until(lambda: stubborn.runs == 1, timeout=5, what="the driver's start")
        elect.commands.put("follow")  # the Lease is lost; the driver ignores its stop
        elect.commands.put("lead")  # and won back
        thread.join(timeout=5)
        assert codes == [EXIT_FAILED]
        assert stubborn.runs == 1  # not started again while its first run is alive
        assert "driver did not stop within the grace period after the Lease" in caplog.text
    finally:
        manager.stop()
        stubborn.release.set()
        thread.join(timeout=5)


def test_a_lease_lost_during_the_stop_does_not_stretch_the_grace() -> None:
    grace = 1.0
    elect = Election()
    stubborn = Counted("driver", Journal())
    manager = Manager(grace=timedelta(seconds=grace), election=elect)
    manager.add(Part("server", Journal()), Group.SERVERS)
    manager.add(stubborn, Group.LEADER_ELECTED)
    thread, codes = run_in_background(manager)
    try:
        elect.commands.put("lead")
        wait_until(lambda: stubborn.runs == 1, timeout=5, what="the driver's start")
        began = time.monotonic()
        manager.stop()
        wait_until(stubborn.asked.is_set, timeout=5, what="the driver's stop")
        Stop().wait(0.6 * grace)  # the Lease is lost well into the grace
        elect.commands.put("follow")
        thread.join(timeout=10)
        took = time.monotonic() - began
    finally:
        stubborn.release.set()
        thread.join(timeout=5)
    assert codes == [EXIT_FAILED]  # the driver outlived the grace
    assert took < grace + 0.3, f"the stop took {took:.2f}s, grace {grace}s"


def test_a_leader_elected_part_needs_an_election() -> None:
    with pytest.raises(ValueError, match="needs leader election"):
        Manager().add(Part("driver", Journal()), Group.LEADER_ELECTED)


SLOW_TO_STOP = """
import threading
from sandboxctl.lifecycle import Manager, Stop

class Slow:
    name = "slow"

    def run(self, stop: Stop) -> None:
        print("running", flush=True)
        stop.wait()
        print("stopping", flush=True)
        threading.Event().wait(60)  # a stop that takes long: a teardown of many sandboxes

with Manager() as manager:
    manager.add(Slow())
    manager.run()
"""


def test_a_second_signal_while_stopping_ends_the_process_at_once() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", SLOW_TO_STOP], stdout=subprocess.PIPE, text=True
    ) as process:
        try:
            assert process.stdout is not None
            assert process.stdout.readline() == "running\n"
            process.send_signal(signal.SIGINT)
            assert process.stdout.readline() == "stopping\n"
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=10) == 128 + signal.SIGTERM
        finally:
            process.kill()

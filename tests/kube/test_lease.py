"""Lease-based leader election against the real control plane (compressed durations): one leader of
two, a handover on stop, failover when the leader dies, and a lease lost in a
control-plane outage that stops leading without stopping the process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from kubernetes import client

from sandboxctl.core.errors import ConfigurationError
from sandboxctl.kube import LeaderElector
from tests.lifecycle.managed import Managed
from tests.sandboxd.servers import wait_until
from tests.testing.kubeapi.double import Kube
from tests.testing.realkube import RealKube

# Compressed, yet with room for a renewal (a read and an etcd-backed write) on a busy
# 2-core machine: a renewal slower than the deadline would end a term no test ended.
FAST = {
    "lease_duration": timedelta(seconds=3),
    "renew_deadline": timedelta(seconds=2),
    "retry_period": timedelta(seconds=0.3),
    "rejoin_after": timedelta(seconds=0.5),
}


class Candidate:
    def __init__(self, api: client.ApiClient, identity: str) -> None:
        self.log: list[str] = []
        self._lock = threading.Lock()
        self.elector = LeaderElector(
            api,
            "sandbox-system",
            "warm-pool-driver",
            identity,
            self._started,
            self._stopped,
            **FAST,
        )
        self.managed = Managed(self.elector)  # a process that campaigns and does nothing else

    def _started(self) -> None:
        with self._lock:
            self.log.append("started")

    def _stopped(self) -> None:
        with self._lock:
            self.log.append("stopped")


@pytest.fixture
def pair(kube: Kube) -> Iterator[tuple[Candidate, Candidate]]:
    a, b = Candidate(kube.api, "a"), Candidate(kube.api, "b")
    yield a, b
    a.managed.stop()
    b.managed.stop()


def holder(api: client.ApiClient) -> str | None:
    lease = client.CoordinationV1Api(api).read_namespaced_lease(
        "warm-pool-driver", "sandbox-system"
    )
    return lease.spec.holder_identity  # type: ignore[no-any-return]


def test_one_leader_of_two_and_a_handover_on_stop(
    pair: tuple[Candidate, Candidate], kube: Kube
) -> None:
    a, b = pair
    a.managed.start()
    b.managed.start()
    wait_until(lambda: a.elector.is_leader or b.elector.is_leader, what="a leader")
    leader, follower = (a, b) if a.elector.is_leader else (b, a)
    wait_until(lambda: leader.elector.stats.renewals >= 3, what="three renewals")
    assert not follower.elector.is_leader
    assert holder(kube.api) == leader.elector.identity
    leader.managed.stop()  # hands the lease back
    assert leader.log == ["started", "stopped"]
    wait_until(lambda: follower.elector.is_leader, timeout=5, what="the follower to take over")
    assert holder(kube.api) == follower.elector.identity


def test_a_dead_leader_is_replaced_after_the_lease_duration(
    pair: tuple[Candidate, Candidate],
) -> None:
    a, b = pair
    a.managed.start()
    wait_until(lambda: a.elector.is_leader, what="a to lead")
    a.elector._release = lambda: None  # type: ignore[method-assign]  # dies holding it
    a.managed.stop()
    b.managed.start()
    wait_until(lambda: b.elector.stats.conflicts or not b.elector.is_leader, what="b to campaign")
    assert not b.elector.is_leader  # a's lease has not run out yet, as b sees it
    wait_until(lambda: b.elector.is_leader, timeout=10, what="b to take over")


def test_an_outage_stops_leading_but_not_the_process(kube: RealKube) -> None:
    plane = kube.plane
    candidate = Candidate(kube.api, "solo")
    candidate.managed.start()
    try:
        wait_until(lambda: candidate.elector.is_leader, what="solo to lead")
        plane.stop_apiserver()
        wait_until(
            lambda: candidate.log == ["started", "stopped"],
            timeout=10,
            what="the lease to be lost",
        )
        assert candidate.elector.stats.lost == 1
        plane.start_apiserver()
        wait_until(lambda: candidate.elector.is_leader, timeout=10, what="solo to lead again")
        assert candidate.log == ["started", "stopped", "started"]
    finally:
        candidate.managed.stop()


def test_durations_must_nest(kube: Kube) -> None:
    with pytest.raises(ConfigurationError):
        LeaderElector(
            kube.api,
            "ns",
            "x",
            "me",
            lambda: None,
            lambda: None,
            lease_duration=timedelta(seconds=1),
            renew_deadline=timedelta(seconds=2),
        )


def test_a_leader_whose_renewals_raise_stops_leading(kube: Kube) -> None:
    """Any failure to renew counts, not only a KubeError: past the renew deadline the
    leader stops leading (no split brain with a successor)."""
    candidate = Candidate(kube.api, "solo")
    candidate.managed.start()
    try:
        wait_until(lambda: candidate.elector.is_leader, what="solo to lead")

        def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("not a KubeError")

        candidate.elector._api.read_namespaced_lease = broken  # type: ignore[method-assign,assignment]
        wait_until(
            lambda: candidate.log == ["started", "stopped"], timeout=10, what="leading to end"
        )
        assert not candidate.elector.is_leader
        assert candidate.elector.stats.lost == 1
    finally:
        candidate.managed.stop()


def test_a_leader_whose_renewal_hangs_stops_leading_while_it_hangs(kube: Kube) -> None:
    """A renewal that hangs (etcd away: kube-apiserver answers nothing, and the client
    waits out its timeout and retries) must not hold the term past the renew deadline: the
    leader steps down while the call still hangs, not once it returns."""
    candidate = Candidate(kube.api, "solo")
    candidate.managed.start()
    released = threading.Event()
    try:
        wait_until(lambda: candidate.elector.is_leader, what="solo to lead")

        def hanging(*args: object, **kwargs: object) -> None:
            released.wait(60)
            raise RuntimeError("the hang ended")

        candidate.elector._api.read_namespaced_lease = hanging  # type: ignore[method-assign,assignment]
        wait_until(
            lambda: candidate.log == ["started", "stopped"], timeout=10, what="leading to end"
        )
        assert not released.is_set()  # it stepped down during the hang
        assert candidate.elector.stats.lost == 1
    finally:
        released.set()
        candidate.managed.stop()

"""The tests of the upstream fix for Terminating workers, ported one for one to the
guard on the real control plane (two stay on the API double, each saying why), plus what
that fix left untested.

The PR's RBAC test (``TestControlPlaneRBACIncludesWorkerPodPatch``) is in
test_manifests.py; its e2e harness check is in test_e2e.py."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from sandboxctl.clock import ManualClock
from sandboxctl.guard.adopt import Adopted, Refused, RefusedReason, adopt
from sandboxctl.guard.busy import CountingSource
from sandboxctl.guard.decide import Busy
from sandboxctl.guard.pods import ANNOTATION, born_guarded, pod_view
from sandboxctl.guard.reconcile import NotSynced
from sandboxctl.kube import Pods
from tests.guard.cluster import NS, T0, Cluster, StaticSource, advance
from tests.guard.realcluster import RealCluster


def test_reconcile_sets_and_clears(cluster: Cluster) -> None:
    """On the double: it counts the PATCHes the reconciler sent and reads their content
    type from the double's request log; kube-apiserver keeps no log of one client's
    requests (its audit log holds every component's)."""
    cluster.pod("busy-unannotated")
    cluster.pod("idle-annotated", annotations={ANNOTATION: "true"})
    source = StaticSource()
    source.busy["busy-unannotated"] = Busy.BUSY
    reconciler = cluster.reconciler(source)
    reconciler.tick()
    patches = cluster.patches()
    assert len(patches) == 2
    assert cluster.annotation("busy-unannotated") == "true"
    assert cluster.annotation("idle-annotated") is None
    assert {p["contentType"] for p in patches} == {"application/merge-patch+json"}
    cluster.settle()
    reconciler.tick()
    reconciler.tick()
    assert len(cluster.patches()) == 2  # the cache shows both: nothing more to send


def test_reconcile_clears_stale_annotation_after_failover(real_cluster: RealCluster) -> None:
    cluster = real_cluster
    # An earlier owner stamped the pod and died; its sessions died with it. A new
    # instance that never stamped anything compares desired (idle: absent) with observed.
    cluster.pod("adopted", annotations={ANNOTATION: "true"})
    reconciler = cluster.reconciler(StaticSource())
    reconciler.tick()
    assert cluster.annotation("adopted") is None
    assert reconciler.metrics.orphans_cleared._value.get() == 1


def test_reconcile_skips_exiting_worker(real_cluster: RealCluster) -> None:
    cluster = real_cluster
    # The worker is gone (its pod Failed or Succeeded): busy or not, nothing is sent. (A
    # node with no kubelet: the test reports the phases, kwok would run the pods.)
    cluster.node("node-gone", kubelet=False)
    cluster.pod("failed", node="node-gone", phase="Failed")
    cluster.pod("succeeded", node="node-gone", phase="Succeeded")
    source = StaticSource()
    source.busy.update(failed=Busy.BUSY, succeeded=Busy.BUSY)
    before = cluster.versions("failed", "succeeded")
    reconciler = cluster.reconciler(source)
    reconciler.tick()
    assert cluster.versions("failed", "succeeded") == before  # nothing written


def test_worker_pod_terminating(real_cluster: RealCluster) -> None:
    cluster = real_cluster
    cluster.pod("draining", finalizers=["test/hold"])
    cluster.pod("live")
    cluster.delete_pod("draining", grace=600)
    reconciler = cluster.reconciler()
    cluster.settle()
    assert reconciler.is_terminating(NS, "draining") is True
    assert reconciler.is_terminating(NS, "live") is False
    assert reconciler.is_terminating(NS, "missing") is False
    assert reconciler.is_terminating(NS, "") is False


def test_relabel_adopted_pod_to_this_owner(real_cluster: RealCluster) -> None:
    cluster = real_cluster
    cluster.pod("w9", labels={"guard-owner": "old-guard", "worker-id": "9"})
    outcome = adopt(Pods(cluster.kube.api), NS, "w9", "guard-owner", "test-guard")
    assert isinstance(outcome, Adopted)
    assert outcome.previous == "old-guard"
    labels = cluster.get_pod("w9")["metadata"]["labels"]
    assert labels == {"app": "worker", "guard-owner": "test-guard", "worker-id": "9"}


def test_reconcile_no_data_race(real_cluster: RealCluster) -> None:
    """16 workers, 16 threads each flipping its worker's sessions 2000 times under the
    source's lock, while the reconciler ticks and the Terminating check loops. No call to
    the API runs under the source's lock; every annotation ends where the counts say."""
    cluster = real_cluster
    names = [f"w{i:02d}" for i in range(16)]
    for name in names:
        cluster.pod(name)
    source = CountingSource()
    held_during_call: list[str] = []

    class Watching(Pods):
        def patch(self, namespace: str, name: str, body: dict[str, Any], timeout: float) -> Any:
            # The lock is not re-entrant: if this thread held it, this would time out.
            if not source.lock.acquire(timeout=5):
                held_during_call.append(name)
            else:
                source.lock.release()
            return super().patch(namespace, name, body, timeout)

    reconciler = cluster.reconciler(source, calls=Watching(cluster.kube.api))
    stop = threading.Event()
    failures: list[BaseException] = []

    rounds = [0]

    def guard(step: Any) -> None:
        try:
            while not stop.is_set():
                step()
                rounds[0] += 1
                stop.wait(0.002)  # pacing, so the flippers get the interpreter too
        except BaseException as error:  # pragma: no cover - reported below
            failures.append(error)

    def flip(name: str) -> None:
        for _ in range(2000):
            source.acquire(f"{NS}/{name}")
            source.release(f"{NS}/{name}")

    loops = [
        threading.Thread(target=guard, args=(reconciler.tick,)),
        threading.Thread(target=guard, args=(lambda: reconciler.is_terminating(NS, "w00"),)),
    ]
    for loop in loops:
        loop.start()
    flippers = [threading.Thread(target=flip, args=(name,)) for name in names]
    for thread in flippers:
        thread.start()
    for thread in flippers:
        thread.join(timeout=120)
    overlapped = rounds[0]
    stop.set()
    for loop in loops:
        loop.join(timeout=30)
    assert failures == []
    assert overlapped > 2  # the loops really ran while the counts flipped
    assert held_during_call == []
    assert all(source.count(f"{NS}/{name}") == 0 for name in names)
    cluster.settle()
    reconciler.tick()  # the healer: whatever a flip left stamped is cleared
    cluster.settle()
    assert [cluster.annotation(name) for name in names] == [None] * 16


def test_spawned_worker_pod_is_born_annotated_with_a_600s_grace(real_cluster: RealCluster) -> None:
    cluster = real_cluster
    manifest = born_guarded({"metadata": {"name": "spawned"}, "spec": {"containers": []}})
    assert manifest["spec"]["terminationGracePeriodSeconds"] == 600
    cluster.pod("spawned", annotations=manifest["metadata"]["annotations"],
                grace=manifest["spec"]["terminationGracePeriodSeconds"])  # fmt: skip
    pod = pod_view(cluster.get_pod("spawned"))
    assert (pod.grace_seconds, pod.annotated) == (600, True)
    # A manifest's own grace is kept; the annotation is the guard's to clear once idle.
    assert born_guarded({"spec": {"terminationGracePeriodSeconds": 900}})["spec"] == {
        "terminationGracePeriodSeconds": 900
    }
    clock = ManualClock(T0)
    reconciler = cluster.reconciler(clock=clock, idle_grace=timedelta(seconds=30))
    reconciler.tick()
    assert cluster.annotation("spawned") == "true"  # idle, but within its grace
    advance(clock, 31)
    reconciler.tick()
    assert cluster.annotation("spawned") is None


# --- what the PR left untested ---------------------------------------------------------------


def test_adoption_refuses_a_terminating_pod(real_cluster: RealCluster) -> None:
    cluster = real_cluster
    cluster.pod("leaving", labels={"guard-owner": "old"}, finalizers=["test/hold"])
    cluster.delete_pod("leaving", grace=600)
    outcome = adopt(Pods(cluster.kube.api), NS, "leaving", "guard-owner", "new")
    assert outcome == Refused(RefusedReason.TERMINATING)
    assert cluster.get_pod("leaving")["metadata"]["labels"]["guard-owner"] == "old"


def test_a_failed_relabel_changes_nothing(cluster: Cluster) -> None:
    """On the double: a real kube-apiserver cannot be made to answer 503 to exactly the
    next PATCH of one pod; the double's fault injection does."""
    from sandboxctl_testing.kubeapi.server import Fault

    cluster.pod("w1", labels={"guard-owner": "old"})
    cluster.kube.running.server.faults.append(Fault("PATCH", "/pods/w1", 503, 1))
    with pytest.raises(Exception, match=r"503|injected"):
        adopt(Pods(cluster.kube.api), NS, "w1", "guard-owner", "new")
    assert cluster.get_pod("w1")["metadata"]["labels"]["guard-owner"] == "old"


def test_the_terminating_check_refuses_a_cold_cache(real_cluster: RealCluster) -> None:
    cluster = real_cluster
    from sandboxctl.guard.reconcile import Reconciler
    from tests.guard.cluster import settings

    class Cold:
        synced = False

        def items(self) -> list[dict[str, Any]]:
            return []

        def get(self, name: str, namespace: str = "") -> None:
            return None

    reconciler = Reconciler(settings(), Cold(), StaticSource(), Pods(cluster.kube.api))
    try:
        with pytest.raises(NotSynced):
            reconciler.is_terminating(NS, "anything")
        with pytest.raises(NotSynced):
            reconciler.tick()
    finally:
        reconciler.close()

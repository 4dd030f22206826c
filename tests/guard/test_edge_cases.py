"""The guard's edge cases, one named test each: on the real control plane where it can
serve them ("sent no PATCH or DELETE" read there as "the pod's resourceVersion did not
move"), on the API double where a test needs its request log or its fault injection (each
such test says why)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from kubernetes import client

from sandboxctl.clock import ManualClock
from sandboxctl.guard.adopt import Adopted, Refused, RefusedReason, adopt
from sandboxctl.guard.busy import CountingSource
from sandboxctl.guard.decide import Busy, KeepReason
from sandboxctl.guard.health import Deferred, Lost, LostReason, is_schedulable, judge
from sandboxctl.guard.pods import ANNOTATION, OVERRIDE_LABEL, node_view, pod_view
from sandboxctl.guard.probe import ProbeSource
from sandboxctl.guard.service import Guard, UnboundedRefusal
from sandboxctl.guard.sessions import SessionsSource
from sandboxctl.kube import Pods
from sandboxctl_testing.kubeapi.server import Fault
from tests.guard.cluster import NS, T0, Cluster, StaticSource, advance, settings
from tests.guard.endpoints import BlackHole, WorkerEndpoints
from tests.guard.realcluster import RealCluster
from tests.sandboxd.servers import wait_until
from tests.testing.kubeapi.double import api_for


@pytest.fixture
def endpoints() -> Iterator[WorkerEndpoints]:
    made = WorkerEndpoints()
    yield made
    made.close()


def guard_for(cluster: Cluster | RealCluster, source: Any, **options: Any) -> Guard:
    overrides = options.pop("settings", {})
    return Guard(
        settings(**overrides),
        cluster.kube.api,
        lambda pods, on_verdict: source,
        sync_timeout=timedelta(seconds=30),
        watch_seconds=30,
        printer=lambda line: None,
        **options,
    )


def fault(cluster: Cluster, method: str, path: str, status: int, count: int = 1) -> None:
    cluster.kube.running.server.faults.append(Fault(method, path, status, count))


# --- 1 ------------------------------------------------------------------------------------


def test_edge_01_nothing_is_decided_before_the_cache_synced(cluster: Cluster) -> None:
    """On the double: its first pod lists must fail (an injected 503) so the cache stays cold,
    and the request log must show no PATCH; a real kube-apiserver can be made to do neither
    on cue."""
    cluster.pod("busy")
    cluster.nodepool("workers")
    cluster.node("node-a")
    source = StaticSource()
    source.busy["busy"] = Busy.BUSY
    fault(cluster, "GET", f"/api/v1/namespaces/{NS}/pods", 503, count=2)  # the first lists
    guard = guard_for(cluster, source)
    started = threading.Event()
    threading.Thread(target=lambda: (guard.start(), started.set()), daemon=True).start()
    try:
        wait_until(lambda: guard.pods.stats.failures >= 1, what="a failed first list")
        assert not guard.reconciler.synced
        assert guard.status()["synced"] is False
        assert cluster.patches() == []  # a cold cache would read every busy pod unannotated
        assert started.wait(30)
        guard.gate()
        guard.reconciler.tick()
        assert cluster.annotation("busy") == "true"
    finally:
        guard.close()


# --- 2 ------------------------------------------------------------------------------------


def test_edge_02_any_instance_clears_an_orphan_it_never_set(real_cluster: RealCluster) -> None:
    cluster = real_cluster
    cluster.pod("w1")
    first_source = StaticSource()
    first_source.busy["w1"] = Busy.BUSY
    first = cluster.reconciler(first_source)
    first.tick()
    assert cluster.annotation("w1") == "true"
    first.close()  # the first instance dies; the worker's sessions die with it
    second = cluster.reconciler(StaticSource())
    second.tick()
    assert cluster.annotation("w1") is None
    assert second.metrics.orphans_cleared._value.get() == 1
    assert first.metrics.orphans_cleared._value.get() == 0


# --- 3 ------------------------------------------------------------------------------------


class StaleFirstRead(Pods):
    """A relabel that was decided a while ago: its first read is an old copy."""

    def __init__(self, api: client.ApiClient, stale: dict[str, Any]) -> None:
        super().__init__(api)
        self.stale: dict[str, Any] | None = stale

    def get(self, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        if self.stale is not None:
            old, self.stale = self.stale, None
            return old
        return super().get(namespace, name, timeout)


def test_edge_03_only_the_owner_writes_and_a_delayed_relabel_never_wins(cluster: Cluster) -> None:
    """On the double: it counts the PATCHes the guard sent in the double's request log;
    kube-apiserver keeps no log of one client's requests."""
    cluster.pod("w1", labels={"owner": "g1"}, annotations={ANNOTATION: "true"})
    stale = cluster.get_pod("w1")
    g1 = cluster.reconciler(StaticSource(), owner_label="owner", owner="g1")
    # g2 adopts the pod (a conditional relabel) before g1 reconciles.
    assert isinstance(adopt(Pods(cluster.kube.api), NS, "w1", "owner", "g2"), Adopted)
    cluster.settle()
    g1.tick()  # idle by g1's count, but no longer g1's: left alone
    assert cluster.annotation("w1") == "true"
    assert cluster.patches() == [r for r in cluster.patches() if "labels" in r["body"]]
    # A relabel to g3 decided on the old copy (owner g1) is refused by the server (409),
    # re-reads, finds g2 and gives up instead of overwriting the newer owner.
    outcome = adopt(StaleFirstRead(cluster.kube.api, stale), NS, "w1", "owner", "g3")
    assert outcome == Refused(RefusedReason.OWNED_BY_ANOTHER, "g2")
    assert cluster.get_pod("w1")["metadata"]["labels"]["owner"] == "g2"


# --- 4 ------------------------------------------------------------------------------------


def test_edge_04_leaving_the_selector_is_not_dying(
    real_cluster: RealCluster, endpoints: WorkerEndpoints
) -> None:
    cluster = real_cluster
    cluster.pod("w1", labels={"owner": "g1"}, annotations={ANNOTATION: "true"})
    endpoints.probes["w1"] = {"busy": True, "queries": 1}
    verdicts: list[Any] = []
    reconciler = cluster.reconciler(owner_label="owner", owner="g1")
    probe = ProbeSource(endpoints.probe_template, reconciler.pod_views, interval=1, timeout=2,
                        threshold=1, slack=timedelta(0),
                        on_verdict=lambda p, v: verdicts.append(v))  # fmt: skip
    reconciler.source = probe
    try:
        probe.probe_round()
        assert probe.reading(reconciler.pod_views()[0]) is Busy.BUSY
        endpoints.probes["w1"] = 503  # and it stops answering as it is handed over
        cluster.edit("w1", {"labels": {"owner": "g2"}})  # a watch DELETE for g1
        wait_until(lambda: reconciler.pod_views() == [], what="w1 gone from g1's cache")
        handed_over = cluster.versions("w1")
        probe.probe_round()
        reconciler.tick()
    finally:
        probe.stop()
    assert verdicts == []  # forgotten, never declared lost
    # Neither deleted nor written since the handover (no DELETE, no PATCH that changed it).
    assert cluster.versions("w1") == handed_over
    assert cluster.get_pod("w1")["metadata"].get("deletionTimestamp") is None
    assert cluster.annotation("w1") == "true"  # the new owner's to manage


# --- 5 ------------------------------------------------------------------------------------


def test_edge_05_human_edits_and_the_override_label(
    real_cluster: RealCluster, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = real_cluster
    cluster.pod("busy")
    cluster.pod("idle")
    cluster.pod("pinned", labels={OVERRIDE_LABEL: "pin"})
    cluster.pod("off", labels={OVERRIDE_LABEL: "off"}, annotations={ANNOTATION: "true"})
    cluster.pod("duration-idle", annotations={ANNOTATION: "5m"})
    cluster.pod("duration-busy", annotations={ANNOTATION: "5m"})
    source = StaticSource()
    source.busy.update({"busy": Busy.BUSY, "off": Busy.BUSY, "duration-busy": Busy.BUSY})
    reconciler = cluster.reconciler(source)
    with caplog.at_level(logging.INFO, logger="sandboxctl.guard.reconcile"):
        reconciler.tick()
    assert cluster.annotation("busy") == "true"
    assert cluster.annotation("pinned") == "true"  # idle, but pinned
    assert cluster.annotation("off") is None  # busy, but off
    assert cluster.annotation("duration-idle") == "5m"  # not ours: left alone
    assert cluster.annotation("duration-busy") == "true"  # busy: overwritten, and said so
    assert "replaced='5m'" in caplog.text
    cluster.settle()
    cluster.edit("busy", {"annotations": {ANNOTATION: None}})  # a human removes it
    cluster.edit("idle", {"annotations": {ANNOTATION: "true"}})  # a human adds it
    cluster.settle()
    reconciler.tick()  # one tick
    assert cluster.annotation("busy") == "true"
    assert cluster.annotation("idle") is None


# --- 6 ------------------------------------------------------------------------------------


def test_edge_06_a_conflict_rereads_and_retries(cluster: Cluster) -> None:
    """On the double: it needs a 409 on exactly the next PATCHes of one pod (injected) and
    reads the retries from the request log; a real kube-apiserver gives neither on cue."""
    cluster.pod("w1")
    source = StaticSource()
    source.busy["w1"] = Busy.BUSY
    reconciler = cluster.reconciler(source)
    fault(cluster, "PATCH", "/pods/w1", 409)
    reconciler.tick()
    assert cluster.annotation("w1") == "true"
    sent = [(r["method"], r["path"].rsplit("/", 1)[-1]) for r in cluster.requests()
            if r["path"].endswith("/pods/w1")]  # fmt: skip
    assert sent == [("PATCH", "w1"), ("GET", "w1"), ("PATCH", "w1")]
    assert reconciler.metrics.patch_errors.labels("409")._value.get() == 1
    # Three conflicts in a row: the pod backs off instead of spinning.
    cluster.pod("w2")
    source.busy["w2"] = Busy.BUSY
    cluster.settle()
    fault(cluster, "PATCH", "/pods/w2", 409, count=3)
    reconciler.tick()
    assert cluster.annotation("w2") is None
    assert reconciler.memory[pod_view(cluster.get_pod("w2")).uid].retry_at > 0


# --- 7 ------------------------------------------------------------------------------------


def test_edge_07_an_outage_backs_off_per_pod_and_never_stacks_ticks(cluster: Cluster) -> None:
    """On the double: it needs 503s on exactly the next PATCHes of one pod (injected) and
    counts the PATCHes in the request log."""
    cluster.pod("w1")
    source = StaticSource()
    source.busy["w1"] = Busy.BUSY
    clock = ManualClock(T0)
    reconciler = cluster.reconciler(source, clock=clock)
    fault(cluster, "PATCH", "/pods/w1", 503, count=2)
    reconciler.tick()  # 503: backoff 1s
    reconciler.tick()  # within the backoff: nothing sent
    assert len(cluster.patches()) == 1
    advance(clock, 1.1)
    reconciler.tick()  # 503 again: backoff 2s
    advance(clock, 1.1)
    reconciler.tick()
    assert len(cluster.patches()) == 2
    advance(clock, 1.1)
    reconciler.tick()
    assert cluster.annotation("w1") == "true"
    assert reconciler.metrics.patch_errors.labels("503")._value.get() == 2

    # A server that never answers: each call ends at its timeout, at most max_concurrency
    # run at once, and the tick returns at its budget, leaving the rest for the next one.
    hole = BlackHole()
    for i in range(6):
        cluster.pod(f"h{i}")
        source.busy[f"h{i}"] = Busy.BUSY
    cluster.settle()
    slow = cluster.reconciler(source, calls=Pods(api_for(hole.url)), clock=ManualClock(T0),
                              max_concurrency=2, patch_timeout=timedelta(seconds=1),
                              tick_budget=timedelta(milliseconds=100))  # fmt: skip
    try:
        report = slow.tick()
        assert (report.planned, report.sent, report.left) == (6, 0, 4)
        assert slow.metrics.ticks_cut._value.get() == 1
        second = slow.tick()  # the two in flight are skipped, not sent again
        assert second.planned == 4
        wait_until(lambda: slow.metrics.patch_errors.labels("timeout")._value.get() >= 2,
                   what="the calls to time out")  # fmt: skip
        assert hole.most_open <= 2
    finally:
        slow.close()
        hole.close()


# --- 8 ------------------------------------------------------------------------------------


def test_edge_08_a_lagging_informer_does_not_cause_a_patch_storm(cluster: Cluster) -> None:
    """On the double: it counts the PATCHes sent while the informer lags in the request log,
    with nothing else in it."""
    cluster.pod("w1")
    source = StaticSource()
    source.busy["w1"] = Busy.BUSY
    clock = ManualClock(T0)
    reconciler = cluster.reconciler(source, clock=clock, interval=timedelta(seconds=2))
    cluster.informers[0].stop()  # the cache will not show the patch
    reconciler.tick()
    for _ in range(5):
        advance(clock, 0.3)
        reconciler.tick()
    assert len(cluster.patches()) == 1
    advance(clock, 1.0)  # past one interval without the cache moving: resent once
    reconciler.tick()
    reconciler.tick()
    assert len(cluster.patches()) == 2


# --- 9 ------------------------------------------------------------------------------------


def test_edge_09_busy_reconciles_at_once_and_acquire_stamps_before_returning(
    real_cluster: RealCluster,
) -> None:
    cluster = real_cluster
    cluster.pod("w1")
    cluster.pod("w2")
    source = CountingSource()
    reconciler = cluster.reconciler(source)
    source.acquire(f"{NS}/w1")
    reconciler.ensure(NS, "w1")  # on_acquire: synchronous, before the worker is handed out
    assert cluster.annotation("w1") == "true"
    # The daemon: an hour-long interval, yet a 0 -> 1 change reconciles at once.
    guard = guard_for(cluster, source, settings={"interval": timedelta(hours=1)})
    assert guard.start()
    loop = threading.Thread(target=guard.run, daemon=True)
    loop.start()
    try:
        source.acquire(f"{NS}/w2")
        wait_until(lambda: cluster.annotation("w2") == "true", what="w2 stamped on acquire")
        source.release(f"{NS}/w2")
        wait_until(lambda: cluster.annotation("w2") is None, what="w2 cleared on release")
    finally:
        guard.stop()
        loop.join(timeout=10)
        guard.close()


# --- 10 -----------------------------------------------------------------------------------


def test_edge_10_a_node_being_disrupted_takes_no_new_stamp(real_cluster: RealCluster) -> None:
    cluster = real_cluster
    cluster.node("draining", disrupted=True)
    cluster.node("steady")
    cluster.pod("new-busy", node="draining")
    cluster.pod("old-busy", node="draining", annotations={ANNOTATION: "true"})
    cluster.pod("pinned", node="draining", labels={OVERRIDE_LABEL: "pin"})
    cluster.pod("elsewhere", node="steady")
    source = StaticSource()
    source.busy.update({"new-busy": Busy.BUSY, "old-busy": Busy.BUSY, "elsewhere": Busy.BUSY})
    reconciler = cluster.reconciler(source)
    report = reconciler.tick()
    assert cluster.annotation("new-busy") is None
    assert cluster.annotation("old-busy") == "true"  # kept until the pod idles
    assert cluster.annotation("pinned") == "true"
    assert cluster.annotation("elsewhere") == "true"
    uid = pod_view(cluster.get_pod("new-busy")).uid
    assert report.decisions[uid].reason is KeepReason.DISRUPTED_NODE  # type: ignore[union-attr]
    nodes = reconciler.node_views()
    assert not is_schedulable(pod_view(cluster.get_pod("old-busy")), nodes["draining"])
    assert is_schedulable(pod_view(cluster.get_pod("elsewhere")), nodes["steady"])
    ignoring = cluster.reconciler(source, respect_disrupted_taint=False)
    ignoring.tick()
    assert cluster.annotation("new-busy") == "true"


# --- 11 -----------------------------------------------------------------------------------


def test_edge_11_terminating_pods_are_never_patched_and_the_deferral_ends(
    real_cluster: RealCluster,
) -> None:
    cluster = real_cluster
    # A node with no kubelet keeps a deleted pod Terminating with its grace (kwok would
    # finish the deletion at once).
    cluster.node("node-gone", kubelet=False)
    cluster.pod("busy-leaving", node="node-gone")
    cluster.pod("idle-leaving", node="node-gone", annotations={ANNOTATION: "true"})
    cluster.delete_pod("busy-leaving", grace=600)
    cluster.delete_pod("idle-leaving", grace=600)
    leaving = cluster.versions("busy-leaving", "idle-leaving")
    source = StaticSource()
    source.busy["busy-leaving"] = Busy.BUSY
    reconciler = cluster.reconciler(source)
    report = reconciler.tick()
    assert cluster.versions("busy-leaving", "idle-leaving") == leaving  # nothing written
    assert {d.reason for d in report.decisions.values()} == {KeepReason.TERMINATING}  # type: ignore[union-attr]
    pod = pod_view(cluster.get_pod("busy-leaving"))
    assert pod.deletion_timestamp is not None
    slack = timedelta(seconds=30)
    before = judge(pod, True, 3, pod.deletion_timestamp + timedelta(seconds=29), 3, slack)
    assert before == Deferred(pod.deletion_timestamp + slack)
    after = judge(pod, True, 3, pod.deletion_timestamp + timedelta(seconds=30), 3, slack)
    assert after == Lost(LostReason.DRAIN_DEADLINE)  # never forever
    # The guard never deletes (grace only shrinks): each pod keeps the grace it was given.
    graces = [cluster.get_pod(n)["metadata"]["deletionGracePeriodSeconds"]
              for n in ("busy-leaving", "idle-leaving")]  # fmt: skip
    assert graces == [600, 600]


# --- 12 -----------------------------------------------------------------------------------


def test_edge_12_an_idle_terminating_worker_is_lost_at_once(
    real_cluster: RealCluster, endpoints: WorkerEndpoints
) -> None:
    cluster = real_cluster
    cluster.pod("idle-leaving", finalizers=["test/hold"])
    cluster.delete_pod("idle-leaving", grace=600)
    endpoints.probes["idle-leaving"] = {"busy": False}
    reconciler = cluster.reconciler()
    verdicts: list[Any] = []
    probe = ProbeSource(endpoints.probe_template, reconciler.pod_views, interval=1, timeout=2,
                        threshold=2, slack=timedelta(seconds=30),
                        on_verdict=lambda p, v: verdicts.append(v))  # fmt: skip
    try:
        probe.probe_round()  # idle
        endpoints.probes["idle-leaving"] = 503
        probe.probe_round()
        assert verdicts == []  # one failure is not yet a verdict
        probe.probe_round()
        assert verdicts == [Lost(LostReason.IDLE_TERMINATING)]  # not deferred: at once
        pod = reconciler.pod_views()[0]
        assert probe.reading(pod) is Busy.IDLE
        assert not is_schedulable(pod, None)  # never handed out again
    finally:
        probe.stop()


# --- 13 -----------------------------------------------------------------------------------


def test_edge_13_idle_grace_keeps_short_gaps_from_flapping(
    cluster: Cluster, endpoints: WorkerEndpoints
) -> None:
    """On the double: it counts the PATCHes of each flap in the request log."""
    cluster.pod("w1")
    endpoints.probes["w1"] = {"busy": True, "queries": 1}
    clock = ManualClock(T0)
    reconciler = cluster.reconciler(clock=clock, idle_grace=timedelta(seconds=30))
    probe = ProbeSource(endpoints.probe_template, reconciler.pod_views, interval=1, timeout=2,
                        threshold=3, slack=timedelta(seconds=30))  # fmt: skip
    reconciler.source = probe
    try:
        probe.probe_round()
        reconciler.tick()
        assert cluster.annotation("w1") == "true"
        cluster.settle()
        # Between statements: the session stays open, no query runs (busy = running query).
        endpoints.probes["w1"] = {"busy": False, "queries": 0}
        probe.probe_round()
        advance(clock, 5)
        reconciler.tick()
        endpoints.probes["w1"] = {"queries": 2}
        probe.probe_round()
        advance(clock, 5)
        reconciler.tick()
        assert len(cluster.patches()) == 1  # the gap did not flap it
        endpoints.probes["w1"] = {"busy": False, "queries": 0}
        probe.probe_round()
        reconciler.tick()  # idle from here
        advance(clock, 29)
        reconciler.tick()
        assert cluster.annotation("w1") == "true"
        advance(clock, 2)
        reconciler.tick()
        assert cluster.annotation("w1") is None
    finally:
        probe.stop()


# --- 14 -----------------------------------------------------------------------------------


def test_edge_14_counts_clamp_at_zero(
    real_cluster: RealCluster, endpoints: WorkerEndpoints
) -> None:
    cluster = real_cluster
    counting = CountingSource()
    assert counting.release(f"{NS}/w1") == 0  # a release without an acquire
    assert counting.acquire(f"{NS}/w1") == 1  # not 0: the underflow did not stick
    cluster.pod("w1")
    cluster.pod("w2")
    cluster.pod("w3")
    endpoints.sessions = {"w1": -2, f"{NS}/w2": 1}  # w3 is not named: no sessions
    sessions = SessionsSource(endpoints.sessions_url, interval=1, timeout=2)
    reconciler = cluster.reconciler(sessions)
    try:
        assert sessions.poll()
        readings = {p.name: sessions.reading(p) for p in reconciler.pod_views()}
        assert readings == {"w1": Busy.IDLE, "w2": Busy.BUSY, "w3": Busy.IDLE}
        endpoints.sessions_status = 500  # a sessions outage: nothing changes either way
        sessions.poll()
        assert {sessions.reading(p) for p in reconciler.pod_views()} == {Busy.UNKNOWN}
    finally:
        sessions.stop()


# --- 15 -----------------------------------------------------------------------------------


def test_edge_15_a_pod_recreated_under_its_name_starts_clean(cluster: Cluster) -> None:
    """On the double: it needs a 503, then a 422, on exactly the next PATCH of one pod
    (injected), and counts PATCHes in the request log."""
    cluster.pod("w1")
    source = StaticSource()
    source.busy["w1"] = Busy.BUSY
    clock = ManualClock(T0)
    reconciler = cluster.reconciler(source, clock=clock)
    old_uid = pod_view(cluster.get_pod("w1")).uid
    fault(cluster, "PATCH", "/pods/w1", 503)
    reconciler.tick()
    assert reconciler.memory[old_uid].retry_at > 0  # backing off: the old pod's plan
    cluster.remove_pod("w1")
    cluster.pod("w1")
    new_uid = pod_view(cluster.get_pod("w1")).uid
    cluster.settle()
    reconciler.tick()  # the clock has not moved: the new pod inherits no backoff
    assert cluster.annotation("w1") == "true"
    assert old_uid not in reconciler.memory
    assert new_uid in reconciler.memory

    # A plan made for one pod that meets its successor (a real server refuses the stale
    # uid with 422) re-reads, sees another uid, and drops the plan.
    cluster.pod("w2", annotations={ANNOTATION: "true"})
    cluster.settle()
    cluster.informers[0].stop()  # the cache keeps the first w2
    cluster.remove_pod("w2")
    cluster.pod("w2", annotations={ANNOTATION: "true"})
    fault(cluster, "PATCH", "/pods/w2", 422)
    reconciler.tick()
    assert cluster.annotation("w2") == "true"  # the successor was not touched
    assert len([p for p in cluster.patches() if p["path"].endswith("/w2")]) == 1


# --- 16 -----------------------------------------------------------------------------------


def test_edge_16_the_owner_label_means_only_the_owner(cluster: Cluster) -> None:
    """On the double: it reads from the request log which instance sent which PATCH."""
    from sandboxctl.core.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="must not constrain the owner label"):
        settings(selector="app=worker,owner=g1", owner_label="owner", owner="g1")
    cluster.pod("w1", labels={"owner": "g1", "worker-id": "7", "version": "abc123"})
    source = StaticSource()
    source.busy["w1"] = Busy.BUSY
    reconciler = cluster.reconciler(source, owner_label="owner", owner="g1")
    reconciler.tick()
    adopt(Pods(cluster.kube.api), NS, "w1", "owner", "g2")
    labels = cluster.get_pod("w1")["metadata"]["labels"]
    assert labels == {"app": "worker", "owner": "g2", "worker-id": "7", "version": "abc123"}
    # The reconciler writes the annotation and nothing else (the uid is a precondition).
    annotation_patches = [p for p in cluster.patches() if "annotations" in p["body"]]
    assert annotation_patches
    assert all('"labels"' not in p["body"] for p in annotation_patches)


# --- 17 -----------------------------------------------------------------------------------


def test_edge_17_the_audit_gates_stamping(real_cluster: RealCluster) -> None:
    cluster = real_cluster
    cluster.nodepool("workers", grace=None)
    cluster.node("node-a", nodepool="workers")
    cluster.pod("w1")
    before = cluster.versions("w1")
    source = StaticSource()
    source.busy["w1"] = Busy.BUSY
    refused = guard_for(cluster, source)
    assert refused.start()
    with pytest.raises(UnboundedRefusal) as error:
        refused.gate()
    message = str(error.value)
    assert "\n" not in message
    assert "refusing to stamp" in message
    assert "workers" in message
    assert "--allow-unbounded" in message
    assert cluster.versions("w1") == before  # the refused guard wrote nothing
    allowed = guard_for(cluster, source, allow_unbounded=True)
    try:
        assert allowed.start()
        assert allowed.gate().verdict.value == "fail"
        allowed.reconciler.tick()
        assert cluster.annotation("w1") == "true"
    finally:
        allowed.close()


def test_node_views_read_the_taint_and_the_nodepool() -> None:
    view = node_view({"metadata": {"name": "n", "labels": {"karpenter.sh/nodepool": "p"}},
                      "spec": {"taints": [{"key": "karpenter.sh/disrupted"}]}})  # fmt: skip
    assert (view.name, view.nodepool, view.disrupted) == ("n", "p", True)

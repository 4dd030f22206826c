"""End to end with real processes: ``sandboxctl guard-workers`` runs as its own process
against the real control plane (``real_kube``: kube-apiserver, with kwok running the worker
pods), reading a sessions endpoint or per-pod probes served by this test; everything is
observed from outside (the pods, ``/status``, ``/metrics``, exit codes and output)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sandboxctl.core.timestamps import parse_rfc3339
from tests.guard.cluster import NS, SELECTOR
from tests.guard.endpoints import WorkerEndpoints
from tests.guard.realcluster import RealCluster
from tests.sandboxd.servers import free_port, service_process, wait_until

INTERVAL = 1.0  # --interval of the guards below, in seconds


@pytest.fixture
def cluster(real_cluster: RealCluster) -> RealCluster:
    return real_cluster


@pytest.fixture
def endpoints() -> Iterator[WorkerEndpoints]:
    made = WorkerEndpoints()
    yield made
    made.close()


@dataclass
class Running:
    url: str
    output: IO[bytes]
    process: subprocess.Popen[bytes]

    def log(self) -> str:
        self.output.seek(0)
        return self.output.read().decode(errors="replace")


@contextmanager
def guard(cluster: RealCluster, *arguments: str) -> Iterator[Running]:
    """``guard-workers run`` until /healthz answers (its caches synced)."""
    port = free_port()
    command = [
        "guard-workers", "run", f"--kubeconfig={cluster.kube.kubeconfig}", f"--namespace={NS}",
        f"--selector={SELECTOR}", f"--interval={INTERVAL:g}s", f"--listen=127.0.0.1:{port}",
        *arguments,
    ]  # fmt: skip
    with tempfile.TemporaryFile() as output:
        url = f"http://127.0.0.1:{port}"
        with service_process(command, f"{url}/healthz", output=output) as process:
            yield Running(url, output, process)


def cli(cluster: RealCluster, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandboxctl", "guard-workers", *arguments,
         f"--kubeconfig={cluster.kube.kubeconfig}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def metric(url: str, name: str, labels: dict[str, str] | None = None) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and (labels is None or sample.labels == labels):
                return float(sample.value)
    raise AssertionError(f"no {name} {labels or ''} in /metrics")


def status(url: str) -> dict[str, Any]:
    document: dict[str, Any] = httpx.get(f"{url}/status", timeout=5).json()
    return document


def bounded_pool(cluster: RealCluster) -> None:
    cluster.nodepool("workers", grace="1h")
    cluster.node("node-a", nodepool="workers")


def test_e2e_a_busy_worker_is_annotated_within_a_tick_and_cleared_after_the_idle_grace(
    cluster: RealCluster, endpoints: WorkerEndpoints
) -> None:
    bounded_pool(cluster)
    for name in ("w1", "w2", "w3"):
        cluster.pod(name)
    cluster.edit("w3", {"annotations": {"karpenter.sh/do-not-disrupt": "true"}})
    endpoints.sessions = {"w3": 1}  # someone else's session: the baseline
    with guard(cluster, f"--busy-source=sessions={endpoints.sessions_url}",
               "--idle-grace=3s") as running:  # fmt: skip
        url = running.url
        assert cluster.get_pod("w1")["spec"]["terminationGracePeriodSeconds"] == 600
        baseline = {n for n in ("w1", "w2", "w3") if cluster.annotation(n) == "true"}
        assert baseline == {"w3"}
        endpoints.sessions = {"w3": 1, "w1": 1}  # our session lands on w1
        polls = endpoints.sessions_hits
        wait_until(lambda: cluster.annotation("w1") == "true", what="w1 annotated")
        # Within one tick: stamped on the first poll that saw it busy (one more poll may
        # have started while this test looked), counted in polls, not in wall time.
        assert endpoints.sessions_hits - polls <= 2
        newly = {n for n in ("w1", "w2", "w3") if cluster.annotation(n) == "true"} - baseline
        assert newly == {"w1"}
        endpoints.sessions = {"w3": 1}  # the session ends
        ended = time.monotonic()
        row = wait_until(lambda: _row(status(url), "w1", busy="idle"), what="w1 read idle")
        assert row["annotated"]
        assert row["decision"] == "clear after idle-grace"
        wait_until(lambda: cluster.annotation("w1") is None, what="w1 cleared after the grace")
        assert time.monotonic() - ended >= 3  # not before the grace
        assert cluster.annotation("w3") == "true"
        assert metric(url, "sandboxctl_guard_patches_total", {"op": "stamp"}) == 1
        assert metric(url, "sandboxctl_guard_patches_total", {"op": "clear"}) == 1
        assert metric(url, "sandboxctl_guard_pods_guarded") == 3


def test_e2e_a_second_instance_taking_over_clears_the_first_ones_stale_annotations(
    cluster: RealCluster, endpoints: WorkerEndpoints
) -> None:
    bounded_pool(cluster)
    for name in ("w1", "w2"):
        cluster.pod(name, labels={"guard-owner": "g1", "worker-id": name[-1]})
    endpoints.sessions = {"w1": 2, "w2": 1}
    source = f"--busy-source=sessions={endpoints.sessions_url}"
    with guard(cluster, source, "--owner-label=guard-owner=g1") as first:
        wait_until(lambda: cluster.annotation("w1") == cluster.annotation("w2") == "true",
                   what="g1 to stamp both")  # fmt: skip
        first.process.send_signal(signal.SIGKILL)  # g1 dies hard; its sessions die with it
        first.process.wait(timeout=10)
    endpoints.sessions = {}
    adopted = cli(cluster, "adopt", f"--namespace={NS}", f"--selector={SELECTOR}",
                  "--owner-label=guard-owner=g2", "--from=g1", "-o", "json")  # fmt: skip
    assert adopted.returncode == 0, adopted.stderr
    assert [p["result"] for p in json.loads(adopted.stdout)["pods"]] == ["adopted", "adopted"]
    assert cluster.annotation("w1") == cluster.annotation("w2") == "true"  # stale
    with guard(cluster, source, "--owner-label=guard-owner=g2") as second:
        url = second.url
        wait_until(lambda: cluster.annotation("w1") is None and cluster.annotation("w2") is None,
                   what="g2 to clear g1's stale annotations")  # fmt: skip
        assert metric(url, "sandboxctl_guard_orphans_cleared_total") == 2
    labels = cluster.get_pod("w1")["metadata"]["labels"]
    assert labels == {"app": "worker", "guard-owner": "g2", "worker-id": "1"}


def test_e2e_a_humans_removal_is_restored_within_one_tick(
    cluster: RealCluster, endpoints: WorkerEndpoints
) -> None:
    bounded_pool(cluster)
    cluster.pod("w1")
    endpoints.sessions = {"w1": 1}
    # No timed tick within the test (a loaded machine delays the watch's event past one
    # interval): what restores the annotation is the tick the pod's event runs.
    arguments = (f"--busy-source=sessions={endpoints.sessions_url}", "--interval=300s")
    with guard(cluster, *arguments) as running:
        url = running.url
        wait_until(lambda: cluster.annotation("w1") == "true", what="w1 stamped")
        ticks = metric(url, "sandboxctl_guard_tick_seconds_count")
        cluster.edit("w1", {"annotations": {"karpenter.sh/do-not-disrupt": None}})
        wait_until(lambda: cluster.annotation("w1") == "true", what="the annotation restored")
        # Within one tick: the edit's event runs one, which restores it; the restore's own
        # event may run a second, and the first stamp's own event, late on a loaded
        # machine, a third; each of those finds nothing to do (one restore: the patches
        # below). Counted in ticks, not time: the timed tick is 300 s away.
        assert metric(url, "sandboxctl_guard_tick_seconds_count") - ticks <= 3
        assert metric(url, "sandboxctl_guard_patches_total", {"op": "stamp"}) == 2


def test_e2e_a_terminating_busy_worker_is_deferred_until_its_deadline_then_lost(
    cluster: RealCluster, endpoints: WorkerEndpoints
) -> None:
    cluster.nodepool("workers", grace="1h")
    # A node with no kubelet: its pod stays Terminating past its grace (kwok would finish
    # the deletion at once), so only the guard's own deadline can end the wait.
    cluster.node("node-gone", nodepool="workers", kubelet=False)
    cluster.pod("w1", node="node-gone")
    endpoints.probes["w1"] = {"busy": True, "queries": 1}
    with guard(cluster, f"--busy-source=probe={endpoints.probe_template}",
               "--probe-fail-threshold=2", "--drain-slack=1s") as running:  # fmt: skip
        url = running.url
        wait_until(lambda: cluster.annotation("w1") == "true", what="w1 stamped")
        cluster.delete_pod("w1", grace=4)  # SIGTERM: the worker drains, and stops answering
        endpoints.probes["w1"] = 503
        deferred = wait_until(lambda: _row(status(url), "w1", health="deferred"),
                              what="w1 deferred")  # fmt: skip
        deadline = parse_rfc3339(deferred["deadline"])
        deletion = parse_rfc3339(cluster.get_pod("w1")["metadata"]["deletionTimestamp"])
        assert (deadline - deletion).total_seconds() == 1  # deletionTimestamp + slack
        assert deferred["terminating"]
        assert not deferred["schedulable"]
        assert metric(url, "sandboxctl_guard_drains_deferred_total") == 1

        def lost() -> dict[str, Any] | None:
            row = _row(status(url), "w1")
            if row is not None and row["health"] == "lost":
                # Seen only after the guard judged it, so never before the deadline.
                assert time.time() >= deadline.timestamp()
                return row
            return None

        row = wait_until(lost, timeout=15, what="w1 declared lost at its deadline")
        assert row["lostReason"] == "drain-deadline-passed"
        assert metric(url, "sandboxctl_guard_workers_lost_total",
                      {"reason": "drain-deadline-passed"}) == 1  # fmt: skip
        assert cluster.annotation("w1") == "true"  # a Terminating pod is never patched
        log = running.log()
    assert "event=drain-deferred pod=workers/w1" in log
    assert "event=worker-lost pod=workers/w1" in log
    # The guard never deleted it: a delete can only shorten the grace the pod was given.
    assert cluster.get_pod("w1")["metadata"]["deletionGracePeriodSeconds"] == 4


def test_e2e_the_audit_verdicts_and_exit_codes(cluster: RealCluster) -> None:
    cluster.nodepool("bounded", grace="1h")
    cluster.nodepool("unbounded", grace=None)
    cluster.nodepool("tight", grace="5m")
    for pool in ("bounded", "unbounded", "tight"):
        cluster.node(f"node-{pool}", nodepool=pool)
        cluster.pod(f"w-{pool}", node=f"node-{pool}", labels={"pool": pool},
                    annotations={"karpenter.sh/do-not-disrupt": "true"})  # fmt: skip

    before = cluster.versions("w-bounded", "w-unbounded", "w-tight")

    def audit(pool: str, *more: str) -> subprocess.CompletedProcess[str]:
        return cli(cluster, "audit-nodepools", f"--namespace={NS}",
                   f"--selector=app=worker,pool={pool}", *more)  # fmt: skip

    ok = audit("bounded")
    assert ok.returncode == 0, ok.stderr
    assert "verdict: ok (exit 0)" in ok.stdout
    assert "worst-case roll 1h0m0s" in ok.stdout
    fail = audit("unbounded")
    assert fail.returncode == 2
    assert "no-termination-grace-period" in fail.stdout
    assert "verdict: fail (exit 2)" in fail.stdout
    warn = audit("tight", "--fail-on=warn", "-o", "json")
    assert warn.returncode == 2  # a WARN, made fatal
    document = json.loads(warn.stdout)
    assert (document["verdict"], document["exitCode"]) == ("warn", 2)
    assert [f["rule"] for f in document["findings"] if f["level"] == "WARN"] == [
        "grace-not-above-worker-grace"
    ]
    # run refuses to stamp on a FAIL, in one line, and stamps nothing.
    refused = subprocess.run(
        [sys.executable, "-m", "sandboxctl", "guard-workers", "run",
         f"--kubeconfig={cluster.kube.kubeconfig}", f"--namespace={NS}",
         "--selector=app=worker,pool=unbounded", "--busy-source=annotation=busy",
         f"--listen=127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2
    errors = [line for line in refused.stderr.splitlines() if line.startswith("sandboxctl:")]
    assert len(errors) == 1
    assert "refusing to stamp" in errors[0]
    assert "--allow-unbounded" in errors[0]
    assert "Traceback" not in refused.stderr
    assert cluster.versions("w-bounded", "w-unbounded", "w-tight") == before  # nothing written


def _row(document: dict[str, Any], name: str, **want: str) -> dict[str, Any] | None:
    for row in document.get("pods") or []:
        if row["name"] == name and all(row.get(k) == v for k, v in want.items()):
            return dict(row)
    return None

"""The ``guard-workers`` verbs in process: ``status`` against a running guard's HTTP,
``clear``, ``adopt`` (on the real control plane), ``run --dry-run``'s printed patches (on
the double: see its test), the metrics it serves, and one-line errors for bad flags."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest

from sandboxctl.cli.app import main
from sandboxctl.guard.decide import Busy
from sandboxctl.guard.metrics import GuardMetrics
from sandboxctl.guard.serve import GuardHttp
from sandboxctl.guard.service import Guard
from tests.guard.cluster import NS, SELECTOR, Cluster, StaticSource, settings
from tests.guard.realcluster import RealCluster
from tests.sandboxd.servers import wait_until


def sandboxctl(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(list(args))
    captured = capsys.readouterr()
    return int(exited.value.code or 0), captured.out, captured.err


@pytest.fixture
def running(real_cluster: RealCluster) -> Iterator[tuple[Guard, str]]:
    cluster = real_cluster
    cluster.nodepool("workers")
    cluster.node("node-a")
    cluster.pod("busy")
    cluster.pod("idle", annotations={"karpenter.sh/do-not-disrupt": "true"})
    cluster.pod("leaving", finalizers=["test/hold"])
    cluster.delete_pod("leaving", grace=600)
    source = StaticSource()
    source.busy.update(busy=Busy.BUSY, leaving=Busy.BUSY)
    metrics = GuardMetrics()
    guard = Guard(settings(idle_grace=timedelta(hours=1)), cluster.kube.api,
                  lambda pods, on_verdict: source, metrics=metrics, watch_seconds=30)  # fmt: skip
    http = GuardHttp(metrics.registry, guard.status, lambda: guard.ready)
    port = http.serve("127.0.0.1", 0)
    loop = threading.Thread(target=lambda: guard.start() and (guard.gate(), guard.run()))
    loop.start()
    try:
        wait_until(lambda: cluster.annotation("busy") == "true", what="the busy pod stamped")
        yield guard, f"http://127.0.0.1:{port}"
    finally:
        guard.stop()
        loop.join(timeout=15)
        guard.close()
        http.close()


def test_status_shows_what_is_guarded_busy_annotated_and_why(
    running: tuple[Guard, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, url = running
    code, out, _ = sandboxctl(capsys, "guard-workers", "status", f"--server={url}", "-o", "json")
    assert code == 0
    document = json.loads(out)
    assert document["kind"] == "GuardStatus"
    assert document["synced"] is True
    assert document["audit"]["verdict"] == "ok"
    assert document["counts"] == {"guarded": 3, "busy": 2, "annotated": 2, "mismatched": 0,
                                  "terminating": 1, "deferred": 0, "lost": 0}  # fmt: skip
    rows = {row["name"]: row for row in document["pods"]}
    assert rows["idle"]["decision"] == "clear after idle-grace"
    assert rows["idle"]["wanted"] is True  # still within its grace
    assert rows["leaving"]["decision"] == "terminating"
    assert rows["leaving"]["schedulable"] is False
    code, out, _ = sandboxctl(capsys, "guard-workers", "status", f"--server={url}")
    assert "guarded=3 busy=2 annotated=2" in out
    assert "leaving" in out
    assert httpx.get(f"{url}/healthz").status_code == 200


def test_the_guard_serves_its_metrics(running: tuple[Guard, str]) -> None:
    _, url = running
    text = httpx.get(f"{url}/metrics").text
    for name in (
        "pods_guarded 3.0",
        'patches_total{op="stamp"} 1.0',
        "patch_errors_total",
        "orphans_cleared_total 0.0",
        "drains_deferred_total 0.0",
        "tick_seconds_count",
    ):
        assert f"sandboxctl_guard_{name}" in text  # fmt: skip


def test_status_of_a_guard_that_does_not_answer_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = sandboxctl(capsys, "guard-workers", "status", "--server=http://127.0.0.1:9")
    assert code == 2
    assert err.startswith("sandboxctl: error: cannot read http://127.0.0.1:9/status")
    assert err.count("\n") == 1


def test_clear_removes_every_annotation_the_guard_manages(
    real_cluster: RealCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = real_cluster
    cluster.pod("a", annotations={"karpenter.sh/do-not-disrupt": "true"})
    cluster.pod("pinned", annotations={"karpenter.sh/do-not-disrupt": "true"},
                labels={"sandbox.cocoonstack.io/guard": "pin"})  # fmt: skip
    cluster.pod("foreign", annotations={"karpenter.sh/do-not-disrupt": "30m"})
    cluster.pod("plain")
    cluster.pod("other-app", labels={"app": "other"},
                annotations={"karpenter.sh/do-not-disrupt": "true"})  # fmt: skip
    base = ("guard-workers", "clear", f"--kubeconfig={cluster.kube.kubeconfig}",
            f"--namespace={NS}", f"--selector={SELECTOR}", "-o", "json")  # fmt: skip
    code, out, _ = sandboxctl(capsys, *base, "--dry-run")
    assert code == 0
    assert {p["name"]: p["result"] for p in json.loads(out)["pods"]} == {
        "a": "would-clear", "pinned": "would-clear"}  # fmt: skip
    assert cluster.annotation("a") == "true"
    code, out, _ = sandboxctl(capsys, *base)
    assert code == 0
    rows = {p["name"]: p for p in json.loads(out)["pods"]}
    assert rows["a"]["result"] == rows["pinned"]["result"] == "cleared"
    assert rows["pinned"]["pinned"] is True
    assert cluster.annotation("a") is None
    assert cluster.annotation("pinned") is None
    assert cluster.annotation("foreign") == "30m"  # not the guard's value
    assert cluster.annotation("other-app") == "true"  # not the guard's pod


def test_adopt_relabels_conditionally_and_refuses_terminating_pods(
    real_cluster: RealCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = real_cluster
    cluster.pod("w1", labels={"owner": "g1"})
    cluster.pod("w2", labels={"owner": "g1"}, finalizers=["test/hold"])
    cluster.pod("w3", labels={"owner": "g9"})
    cluster.delete_pod("w2", grace=600)
    base = ("guard-workers", "adopt", f"--kubeconfig={cluster.kube.kubeconfig}",
            f"--namespace={NS}", f"--selector={SELECTOR}", "--owner-label=owner=g2",
            "--from=g1", "-o", "json")  # fmt: skip
    code, out, _ = sandboxctl(capsys, *base, "--dry-run")
    assert code == 0
    assert [p["result"] for p in json.loads(out)["pods"]] == ["would-adopt", "would-adopt"]
    code, out, _ = sandboxctl(capsys, *base)
    assert code == 1  # one was refused
    assert {p["name"]: p["result"] for p in json.loads(out)["pods"]} == {
        "w1": "adopted", "w2": "refused: terminating"}  # fmt: skip
    owners = {n: cluster.get_pod(n)["metadata"]["labels"]["owner"] for n in ("w1", "w2", "w3")}
    assert owners == {"w1": "g2", "w2": "g1", "w3": "g9"}


def test_dry_run_prints_each_patch_once_and_sends_none(cluster: Cluster) -> None:
    """On the double: "sends none" is read from its request log, which holds every request
    the reconciler made and nothing else; a real kube-apiserver keeps no such log (its
    audit log would also hold the informers', kwok's and the controllers' requests)."""
    cluster.pod("busy")
    cluster.pod("idle", annotations={"karpenter.sh/do-not-disrupt": "true"})
    source = StaticSource()
    source.busy["busy"] = Busy.BUSY
    printed: list[str] = []
    reconciler = cluster.reconciler(source, dry_run=True)
    reconciler._printer = printed.append
    for _ in range(3):
        reconciler.tick()
    lines = sorted((json.loads(line) for line in printed), key=lambda line: line["name"])
    assert [(line["name"], line["op"], line["dryRun"]) for line in lines] == [
        ("busy", "stamp", True), ("idle", "clear", True)]  # fmt: skip
    assert lines[0]["patch"]["metadata"]["annotations"] == {"karpenter.sh/do-not-disrupt": "true"}
    assert cluster.patches() == []


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--busy-source=sandbox-hosts"], "--namespace is required"),
        (["--namespace=w", "--busy-source=nope"], "expected sessions=URL"),
        (["--namespace=w", "--busy-source=sandbox-hosts", "--owner-label=x"], "KEY=VALUE"),
        (["--namespace=w", "--busy-source=sandbox-hosts", "--interval=0s"], "--interval must"),
        (["--namespace=w", "--busy-source=sandbox-hosts", "--selector=a in ("], "--selector"),
        (["--namespace=w", "--busy-source=sandbox-hosts", "--listen=nowhere"], "HOST:PORT"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(
    args: list[str], problem: str, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    code, _, err = sandboxctl(capsys, "guard-workers", "run", f"--kubeconfig={kubeconfig}", *args)
    assert code == 2
    assert problem in err
    assert err.count("\n") == 1
    assert "Traceback" not in err

"""The NodePool audit: each rule on plain objects, and the CLI's table, JSON and exit
codes against the real control plane, where Karpenter's own CRDs validate the NodePools
and NodeClaims (in process; test_e2e.py runs it as a process)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from sandboxctl.cli.app import main
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.guard.audit import (
    AuditInput,
    Budget,
    ClaimView,
    Level,
    Worker,
    audit,
    nodepool_spec,
)
from sandboxctl.guard.pods import NodeView
from tests.guard.cluster import NS
from tests.guard.realcluster import RealCluster


def pool(name: str = "workers", grace: str | None = "1h", **disruption: Any) -> dict[str, Any]:
    template: dict[str, Any] = {}
    if grace is not None:
        template["terminationGracePeriod"] = grace
    if "expire" in disruption:
        template["expireAfter"] = disruption.pop("expire")
    return {
        "metadata": {"name": name},
        "spec": {"template": {"spec": template}, "disruption": disruption},
    }


def given(
    *pools: dict[str, Any],
    workers: tuple[Worker, ...] = (Worker("w/w1", "n1", True, 600),),
    nodes: tuple[NodeView, ...] = (NodeView("n1", "workers", False),),
    **options: Any,
) -> AuditInput:
    specs = {s.name: s for s in map(nodepool_spec, pools)}
    return AuditInput(specs, workers, {n.name: n for n in nodes}, **options)


def rules(report: Any, level: Level) -> list[str]:
    return [f.rule for f in report.findings if f.level is level]


def test_a_bounded_nodepool_passes_with_its_budgets_and_roll_time() -> None:
    report = audit(given(pool(budgets=[{"nodes": "1", "reasons": ["Drifted"]},
                                       {"nodes": "100%", "reasons": ["Empty"]}])))  # fmt: skip
    assert report.verdict is Level.OK
    assert report.exit_code() == 0
    (only,) = report.pools
    assert only.budgets == {"Drifted": 1, "Empty": 1, "Underutilized": 1}
    assert only.worst_case_roll == timedelta(hours=1)
    assert set(rules(report, Level.INFO)) == {"budgets", "consolidation", "worst-case-roll"}


def test_no_grace_period_fails_while_the_guard_is_on() -> None:
    report = audit(given(pool(grace=None)))
    assert rules(report, Level.FAIL) == ["no-termination-grace-period"]
    assert report.exit_code() == 2
    assert report.pools[0].worst_case_roll is None  # unbounded
    off = audit(given(pool(grace=None), guard_enabled=False))
    assert rules(off, Level.FAIL) == []
    assert rules(off, Level.WARN) == ["expiry-with-annotations"]  # an annotated pod
    never = audit(given(pool(grace=None, expire="Never"), guard_enabled=False))
    assert never.verdict is Level.OK


def test_a_grace_period_not_above_the_workers_warns() -> None:
    report = audit(given(pool(grace="10m")))  # workers: 600 s
    assert rules(report, Level.WARN) == ["grace-not-above-worker-grace"]
    assert report.exit_code() == 1
    assert report.exit_code(fail_on=Level.WARN) == 2


def test_a_grace_period_above_the_max_roll_warns() -> None:
    report = audit(given(pool(grace="2h"), max_roll=timedelta(hours=1)))
    assert rules(report, Level.WARN) == ["grace-above-max-roll"]


def test_nodeclaims_that_have_not_picked_the_ceiling_up_warn() -> None:
    claims = (
        ClaimView("c1", "workers", timedelta(hours=1), drifted=False),
        ClaimView("c2", "workers", None, drifted=True),
        ClaimView("c3", "workers", timedelta(minutes=30), drifted=False),
        ClaimView("other", "elsewhere", None, drifted=True),
    )
    report = audit(given(pool(), claims=claims))
    assert rules(report, Level.WARN) == ["claims-without-ceiling"]
    assert report.pools[0].claims_without_ceiling == 2
    assert report.pools[0].drifted_claims == ("c2",)
    assert "drifted-claims" in rules(report, Level.INFO)


def test_the_worst_case_roll_counts_busy_nodes_per_drift_slot() -> None:
    nodes = tuple(NodeView(f"n{i}", "workers", i == 0) for i in range(5))
    workers = tuple(Worker(f"w/w{i}", f"n{i}", i < 3, 600) for i in range(5))
    report = audit(given(pool(budgets=[{"nodes": "40%", "reasons": ["Drifted"]}]),
                         workers=workers, nodes=nodes))  # fmt: skip
    (only,) = report.pools
    assert (only.nodes, only.busy_nodes, only.budgets["Drifted"]) == (5, 3, 2)
    assert only.worst_case_roll == timedelta(hours=2)  # ceil(3 / 2) x 1h
    assert only.disrupted_nodes == ("n0",)
    zero = audit(given(pool(budgets=[{"nodes": "0", "reasons": ["Drifted"]}])))
    assert zero.pools[0].worst_case_roll is None
    assert any("never proceeds" in f.message for f in zero.findings)


def test_budgets_default_to_ten_percent_and_scheduled_ones_are_listed() -> None:
    nodes = tuple(NodeView(f"n{i}", "workers", False) for i in range(20))
    report = audit(given(pool(), nodes=nodes))
    assert report.pools[0].budgets == {"Drifted": 2, "Empty": 2, "Underutilized": 2}
    scheduled = audit(given(pool(budgets=[{"nodes": "0", "schedule": "0 9 * * 1-5",
                                           "duration": "8h"}]), nodes=nodes))  # fmt: skip
    assert scheduled.pools[0].budgets["Drifted"] == 20  # none always on: not restricted
    assert scheduled.pools[0].scheduled_budgets == (Budget("0", (), "0 9 * * 1-5", "8h"),)


def test_relevant_nodepools_come_from_the_workers_nodes_and_configuration() -> None:
    report = audit(given(pool("workers"), pool("spare", grace=None), configured=["missing"]))
    assert [p.name for p in report.pools] == ["missing", "workers"]  # not "spare"
    assert rules(report, Level.WARN) == ["nodepool-missing"]
    nothing = audit(given(pool(), workers=()))
    assert rules(nothing, Level.INFO) == ["no-nodepools"]
    no_karpenter = audit(AuditInput({}, nodepool_api=False))
    assert no_karpenter.verdict is Level.OK
    assert rules(no_karpenter, Level.INFO) == ["no-karpenter"]


def test_an_unreadable_nodepool_is_named() -> None:
    with pytest.raises(InvalidValueError, match="NodePool bad: terminationGracePeriod"):
        nodepool_spec(pool("bad", grace="soon"))
    with pytest.raises(InvalidValueError, match="budget nodes"):
        nodepool_spec(pool("bad", budgets=[{"nodes": "many"}]))


# --- the command, in process -----------------------------------------------------------------


def run_cli(
    cluster: RealCluster, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exited:
        main(["guard-workers", "audit-nodepools", f"--kubeconfig={cluster.kube.kubeconfig}",
              *args])  # fmt: skip
    captured = capsys.readouterr()
    return int(exited.value.code or 0), captured.out + captured.err


def test_the_command_reads_the_cluster_and_exits_by_verdict(
    real_cluster: RealCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = real_cluster
    cluster.nodepool("workers", grace="1h", budgets=[{"nodes": "1", "reasons": ["Drifted"]}])
    cluster.node("n1", nodepool="workers")
    cluster.pod("w1", node="n1", annotations={"karpenter.sh/do-not-disrupt": "true"})
    cluster.claim("c1", "workers", grace="1h", node="n1")
    code, out = run_cli(cluster, capsys, f"--namespace={NS}", "-o", "json")
    document = json.loads(out)
    assert (code, document["verdict"], document["exitCode"]) == (0, "ok", 0)
    (entry,) = document["nodePools"]
    assert entry["terminationGracePeriod"] == "1h0m0s"
    assert (entry["busyNodes"], entry["workerGraceSeconds"], entry["budgets"]["Drifted"]) == (
        1,
        600,
        1,
    )
    code, out = run_cli(cluster, capsys, f"--namespace={NS}", "--max-roll=30m")
    assert code == 1
    assert "WARN" in out
    assert "verdict: warn (exit 1)" in out
    code, _ = run_cli(cluster, capsys, f"--namespace={NS}", "--max-roll=30m", "--fail-on=warn")
    assert code == 2


def test_the_command_needs_workers_or_nodepools(
    real_cluster: RealCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = real_cluster
    code, said = run_cli(cluster, capsys)
    assert code == 2
    assert said.startswith("sandboxctl: error: name the workers")
    assert "--nodepool" in said

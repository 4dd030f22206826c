"""The guard against Karpenter's own controllers (the Karpenter lanes G-06..G-10): a real
control plane (etcd, kube-apiserver, kube-scheduler, kwok) of this module's own with
``karpenter-kwok`` running against it, so Karpenter's provisioning, drift, consolidation and
termination act on the pods ``guard-workers`` stamps. The plane is not the shared one:
Karpenter would make nodes for every pending pod of the other tests.

Each lane's verdict (its measured figure and bound) is printed; the lanes' judgments on a kit
that misbehaves are checked without Karpenter."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from rich.console import Console

from sandboxctl.lanes.guard import KARPENTER_LANES, KarpenterScenario
from sandboxctl.lanes.guardkit import (
    Completed,
    GuardWindows,
    KarpenterKit,
    KarpenterWindows,
    LocalGuardKit,
)
from sandboxctl.lanes.kit import Kit
from sandboxctl.lanes.model import Verdict
from sandboxctl.lanes.progress import ConsoleProgress
from sandboxctl_testing.controlplane import ControlPlane
from sandboxctl_testing.controlplane.karpenter import Karpenter


@pytest.fixture(scope="module")
def karpenter_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    workdir = tmp_path_factory.mktemp("karpenter-plane")
    # Karpenter installs its own CRDs (Karpenter.start), as its chart does.
    plane = ControlPlane(workdir, scheduler=True, kwok=True)
    with plane, Karpenter(plane, plane.logs):
        yield plane


def progress() -> ConsoleProgress:
    return ConsoleProgress(Console(stderr=True, no_color=True))


def test_karpenter_lanes_hold_busy_nodes_and_bound_the_hold(
    karpenter_plane: ControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    @contextmanager
    def on_the_plane(_: Kit) -> Iterator[KarpenterKit]:
        with LocalGuardKit.open(karpenter_plane.kubeconfig) as kit:
            yield kit

    kit = cast(Kit, SimpleNamespace(kubeconfig=karpenter_plane.kubeconfig, name="karpenter"))
    started = time.monotonic()
    selected = frozenset(lane.id for lane in KARPENTER_LANES)
    verdicts = list(KarpenterScenario(on_the_plane).run(kit, selected, progress()))
    report = [f"Karpenter lanes, {time.monotonic() - started:.0f} s:"]
    report += [
        f"  {v.lane} {'PASS' if v.passed else 'FAIL'}: {v.figure} [bound: {v.bound}]"
        + (f" ({v.detail})" if v.detail else "")
        for v in verdicts
    ]
    with capsys.disabled():  # the measured figures belong in the test's output
        sys.stderr.write("\n" + "\n".join(report) + "\n")
    assert [v.lane for v in verdicts] == ["G-06", "G-07", "G-08", "G-09", "G-10"]
    failed = [f"{v.lane}: {v.detail}" for v in verdicts if not v.passed]
    assert not failed, failed


class Frozen:
    """A stand-in kit whose guard stamps at once and whose Karpenter makes nodes but never
    disrupts anything: no drift, no drain, no consolidation. With ``drains_all``, it drains
    every drifted node at once instead, the busy one included."""

    namespace = "lanes-guard"

    def __init__(self, drains_all: bool = False) -> None:
        self.windows = GuardWindows(tick=0.05, delivery=0.05)
        self.karpenter = KarpenterWindows(
            hold=0.2, disruption_poll=0.05, consolidation_validation=0.0, node_grace=1,
            pod_grace=0, idle_grace=0.0, slack=0.1, provision=1.0, deadline_skew=0.1,
        )  # fmt: skip
        self.drains_all = drains_all
        self.placed: dict[str, int] = {}
        self.drifted: set[str] = set()
        self.busy: set[str] = set()

    def karpenter_nodepool(self, name: str, **_: Any) -> None: ...

    def place(self, nodepool: str, count: int) -> None:
        self.placed[nodepool] = count

    def unplace(self, nodepool: str) -> None: ...

    def initialized_nodes(self, nodepool: str) -> list[str]:
        return [f"{nodepool}-n{i}" for i in range(self.placed.get(nodepool, 0))]

    def nodeclaims(self, nodepool: str) -> list[dict[str, Any]]:
        if self.drains_all and nodepool in self.drifted:
            return []
        return [
            {"metadata": {"name": f"claim-{node}"}, "status": {"nodeName": node, "conditions": [
                {"type": "Initialized", "status": "True"}]}}
            for node in self.initialized_nodes(nodepool)
        ]  # fmt: skip

    def node_taints(self, node: str) -> list[str] | None:
        return []

    def pool_nodes(self, nodepool: str) -> list[str]:
        return self.initialized_nodes(nodepool)

    def drift(self, nodepool: str, mark: str) -> None:
        self.drifted.add(nodepool)

    def watch_deletion(self, pod: str, seconds: float) -> Any:
        return lambda: None

    def pod(self, name: str, lane: str, node: str, **_: Any) -> None: ...

    def set_busy(self, pod: str, busy: bool) -> None:
        (self.busy.add if busy else self.busy.discard)(pod)

    def annotation(self, pod: str) -> str | None:
        return "true" if pod in self.busy else None

    def get_pod(self, pod: str) -> dict[str, Any] | None:
        return {"metadata": {}}

    def spawn_guard(self, name: str, lane: str, flags: list[str]) -> Any:
        idle = lambda *_: None  # noqa: E731
        return SimpleNamespace(name=name, url="", ready=idle, stop=idle, kill=idle)

    def busy_sessions(self, guard: str) -> str:
        return "--busy-source=sessions=http://127.0.0.1:9/sessions"

    def cli(self, *args: str) -> Completed:
        return Completed(0, "{}", "")

    def selector(self, lane: str) -> str:
        return f"lane={lane}"


def _run(stand_in: Frozen, lanes: set[str]) -> list[Verdict]:
    @contextmanager
    def opener(_: Kit) -> Iterator[KarpenterKit]:
        yield cast(KarpenterKit, stand_in)

    kit = cast(Kit, SimpleNamespace(kubeconfig=Path("unused")))
    return list(KarpenterScenario(opener).run(kit, frozenset(lanes), progress()))


def test_a_karpenter_that_never_disrupts_fails_every_lane_with_its_bound() -> None:
    verdicts = _run(Frozen(), {lane.id for lane in KARPENTER_LANES})
    assert [v.lane for v in verdicts] == ["G-06", "G-07", "G-08", "G-09", "G-10"]
    assert [v.passed for v in verdicts] == [False] * 5
    for verdict in verdicts:
        assert verdict.bound, verdict.lane
        assert verdict.detail, verdict.lane
    assert verdicts[0].figure == "not reached"
    assert "the drifted idle nodes to go" in verdicts[0].detail
    assert verdicts[1].detail == "G-06 left no held node to audit"


def test_a_busy_node_drained_by_drift_fails_the_hold() -> None:
    (verdict,) = _run(Frozen(drains_all=True), {"G-06"})
    assert not verdict.passed
    assert verdict.detail == "the busy node was touched: its NodeClaim or node is gone"

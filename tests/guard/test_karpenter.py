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
from types import SimpleNamespace
from typing import cast

import pytest
from rich.console import Console

from sandboxctl.lanes.guard import KARPENTER_LANES, KarpenterScenario
from sandboxctl.lanes.guardkit import KarpenterKit, LocalGuardKit
from sandboxctl.lanes.kit import Kit
from sandboxctl.lanes.progress import ConsoleProgress
from sandboxctl_testing.controlplane import ControlPlane
from sandboxctl_testing.controlplane.karpenter import Karpenter, without_condition_taints


@pytest.fixture(scope="module")
def karpenter_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    workdir = tmp_path_factory.mktemp("karpenter-plane")
    # Karpenter installs its own CRDs (Karpenter.start), as its chart does.
    plane = without_condition_taints(ControlPlane(workdir, scheduler=True, kwok=True))
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

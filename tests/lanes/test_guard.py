"""The guard lanes G-01..G-05: the guard facet against the real control plane (its
NodePools validated by Karpenter's own CRDs, which the facet finds registered), and the
lanes' judgments on a stand-in facet that misbehaves. The lanes end to end, with real
``guard-workers`` processes, run in tests/lanes/test_local.py; the Karpenter lanes
G-06..G-10 in tests/guard/test_karpenter.py."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
from rich.console import Console

from sandboxctl.lanes import catalog
from sandboxctl.lanes.guard import LANES, GuardScenario
from sandboxctl.lanes.guardkit import Completed, GuardKit, GuardWindows, LocalGuardKit
from sandboxctl.lanes.kit import Kit
from sandboxctl.lanes.progress import ConsoleProgress
from tests.testing.realkube import RealKube


def progress() -> ConsoleProgress:
    return ConsoleProgress(Console(stderr=True, no_color=True))


def test_the_guard_facet_removes_what_it_made(real_kube: RealKube) -> None:
    with LocalGuardKit.open(real_kube.kubeconfig) as kit:
        kit.nodepool("p", None)
        kit.node("n", "p")
        kit.pod("w", "x", "n", held=True)
        kit.delete_pod("w", 30)
        assert kit.get_pod("w") is not None  # held Terminating by its finalizer
        core, custom = kit.core, kit.custom
    assert core.list_namespaced_pod("lanes-guard").items == []
    assert "n" not in [node.metadata.name for node in core.list_node().items]
    pools: Any = custom.list_cluster_custom_object("karpenter.sh", "v1", "nodepools")
    assert pools["items"] == []


def test_the_guard_lanes_run_on_the_local_kit_only_and_last() -> None:
    assert all(lane.kits == frozenset({"local"}) for lane in LANES)
    assert [scenario.lanes for scenario in catalog.SCENARIOS][-1] == LANES
    assert all(scenario.lanes != LANES for scenario, _ in catalog.select(["all"], "external"))


def _gone() -> dict[str, Any]:
    raise httpx.ConnectError("the guard's /status does not answer")


class Sluggish:
    """A stand-in facet whose guard never acts: nothing is ever stamped or cleared, the
    guard's /status does not answer, and the CLI answers as an audit that passes
    everything."""

    namespace = "lanes-guard"

    def __init__(self, windows: GuardWindows) -> None:
        self.windows = windows
        self.annotations: dict[str, str | None] = {}

    def nodepool(self, name: str, grace: str | None) -> None: ...

    def node(self, name: str, nodepool: str) -> None: ...

    def pod(self, name: str, lane: str, node: str, *, owner: str = "", held: bool = False) -> None:
        self.annotations[name] = "true" if held else None  # G-03's worker: born stamped

    def set_busy(self, pod: str, busy: bool) -> None: ...

    def set_unresponsive(self, pod: str) -> None: ...

    def polls(self, guard: str) -> int:
        return 0

    def annotation(self, pod: str) -> str | None:
        return self.annotations.get(pod)

    def get_pod(self, pod: str) -> dict[str, Any] | None:
        return {"metadata": {"annotations": {}}}

    def human_edit(self, pod: str, value: str | None) -> None:
        self.annotations[pod] = value

    def delete_pod(self, pod: str, grace: int) -> None: ...

    def adopt(self, pods: list[str], owner: str, taken_from: str) -> int:
        return len(pods)

    def spawn_guard(self, name: str, lane: str, flags: list[str]) -> Any:
        idle = lambda *_: None  # noqa: E731
        return SimpleNamespace(name=name, url="", ready=idle, stop=idle, kill=idle,
                               status=_gone, metric=lambda *_: 0.0)  # fmt: skip

    def busy_sessions(self, guard: str) -> str:
        return "--busy-source=sessions=http://127.0.0.1:9/sessions"

    def busy_probes(self) -> str:
        return "--busy-source=probe=http://127.0.0.1:9/{name}"

    def cli(self, *args: str) -> Completed:
        return Completed(0, '{"verdict": "ok", "findings": []}', "")

    def selector(self, lane: str) -> str:
        return f"lane={lane}"


def test_a_guard_that_does_not_act_fails_every_lane_with_its_bound() -> None:
    windows = GuardWindows(tick=0.05, delivery=0.05, drain_slack=0.1, worker_grace=0)

    @contextmanager
    def sluggish(_: Kit) -> Iterator[GuardKit]:
        yield Sluggish(windows)

    scenario = GuardScenario(open_kit=sluggish)
    kit = cast(Kit, SimpleNamespace(kubeconfig=Path("unused")))
    verdicts = list(scenario.run(kit, frozenset(lane.id for lane in LANES), progress()))
    assert [v.lane for v in verdicts] == ["G-01", "G-02", "G-03", "G-04", "G-05"]
    assert [v.passed for v in verdicts] == [False] * 5
    for verdict in verdicts:
        assert verdict.bound, verdict.lane
        assert verdict.detail, verdict.lane
    assert verdicts[0].bound == (
        "≤ 0.1 s (1 tick 0.05 s + 0.05 s delivery), at the guard's first or second poll"
    )
    assert verdicts[0].figure == "not reached"
    assert "waited" in verdicts[0].detail
    assert verdicts[3].figure.startswith("unbounded: exit 0, FAIL none; bounded: exit 0")
    # G-03's guard is dead (its /status refuses): that lane fails, the next ones still run.
    assert verdicts[2].detail == "the guard's /status does not answer"


def test_a_stamp_later_than_one_tick_fails_with_its_figure() -> None:
    windows = GuardWindows(tick=0.0, delivery=0.0)

    class Late(Sluggish):
        def annotation(self, pod: str) -> str | None:
            return "true" if pod == "g01-w1" else None

    @contextmanager
    def late(_: Kit) -> Iterator[GuardKit]:
        yield Late(windows)

    kit = cast(Kit, SimpleNamespace(kubeconfig=Path("unused")))
    (verdict,) = GuardScenario(open_kit=late).run(kit, frozenset({"G-01"}), progress())
    assert not verdict.passed
    assert verdict.figure.startswith("stamped ")
    assert verdict.detail == "stamped late"

"""The sandbox lanes (K1B2-01, K1C-01, K1OUT-01, SBL-09, SBL-10) on a stand-in kit: each
PASSes where the kit behaves and FAILs where one part misbehaves the way the lane
exists to catch; and the pure parts they judge with."""

from __future__ import annotations

import json
import re
from typing import cast

import pytest

from sandboxctl.lanes import catalog, k1b2, k1c, k1out, observe, sbl
from sandboxctl.lanes.kit import Kit
from sandboxctl.lanes.model import Scenario, Verdict, Windows
from tests.lanes.sandbox_fakes import FakeFleet, FakeProgress

METRICS = """# TYPE sandboxd_requests_total counter
sandboxd_requests_total{route="/v1/sandboxes/{sandbox_id}",method="GET",status="200"} 3.0
sandboxd_requests_total{route="/v1/sandboxes/{sandbox_id}",method="GET",status="404"} 2.0
sandboxd_requests_total{route="/v1/sandboxes/{sandbox_id}/release",method="POST",status="204"} 1.0
sandboxd_requests_total{route="/v1/sandboxes",method="GET",status="200"} 40.0
sandboxd_requests_total{route="/v1/info",method="GET",status="200"} 40.0
"""


@pytest.fixture
def fleet(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> FakeFleet:
    broken = getattr(request, "param", ())
    made = FakeFleet(*broken)
    monkeypatch.setattr(observe, "try_inventory", made.inventory)
    return made


def run(scenario: Scenario, fleet: FakeFleet, *lanes: str) -> list[Verdict]:
    selected = frozenset(lanes or (lane.id for lane in scenario.lanes))
    return list(scenario.run(cast(Kit, fleet), selected, FakeProgress(fleet)))


def only(verdicts: list[Verdict]) -> Verdict:
    (verdict,) = verdicts
    return verdict


# --- K1B2-01 -----------------------------------------------------------------------------


def test_k1b2_passes_when_a_publisher_restart_is_invisible(fleet: FakeFleet) -> None:
    verdict = only(run(k1b2.PublisherRestart(fleet.clock), fleet))
    assert verdict.passed, verdict
    assert "0 watch events after the opening burst" in verdict.figure
    assert "0 log lines naming lanes-b" in verdict.figure
    assert fleet.operations == ["stop_publisher B", "start_publisher B stamp=True"]
    assert not fleet.sandboxes  # the fresh sandboxes are released


@pytest.mark.parametrize("fleet", [("restart_drops",)], indirect=True)
def test_k1b2_fails_when_the_restart_drops_the_node(fleet: FakeFleet) -> None:
    verdict = only(run(k1b2.PublisherRestart(fleet.clock), fleet))
    assert not verdict.passed
    assert "14 watch events after the opening burst" in verdict.figure  # 7 per watch
    assert "2 log lines naming lanes-b" in verdict.figure
    assert "replica-0 listed 0 B sandboxes" in verdict.detail
    assert fleet.publisher["lanes-b"] == "stamping"


def test_k1b2_judges_the_restart_by_the_gap_between_b_s_publishes() -> None:
    fresh = frozenset({"default/x"})
    observed = k1b2.Observed(fresh, {"r": fresh}, down=8.0, stamp_before="2026-12-01T00:00:00Z")
    observed.polls.append(k1b2.Poll(0.0, True, {"r": fresh}, "2026-12-01T00:00:00Z"))
    observed.polls.append(k1b2.Poll(9.0, True, {"r": fresh}, "2026-12-01T00:00:09Z"))
    assert k1b2.judge(observed, Windows(3, 9), "lanes-b").passed  # 9 s: kept (not over 9)
    observed.polls[1].stamp = "2026-12-01T00:00:10Z"
    verdict = k1b2.judge(observed, Windows(3, 9), "lanes-b")
    assert not verdict.passed
    assert "publishes were 10 s apart: the restart was not inside the window" in verdict.detail
    observed.polls.pop()
    assert "no new stamp" in k1b2.judge(observed, Windows(3, 9), "lanes-b").detail


# --- K1C-01 ------------------------------------------------------------------------------


def test_k1c_passes_when_an_unstamped_node_stays(fleet: FakeFleet) -> None:
    verdict = only(run(k1c.OldPublisher(fleet.clock), fleet))
    assert verdict.passed, verdict
    assert re.match(
        r"12\.\d s with B's publisher unstamped: .* in (\d+) of \1 polls$", verdict.figure
    )
    assert fleet.operations == [
        "stop_publisher B",
        "start_publisher B stamp=False",
        "start_publisher B stamp=True",
    ]


@pytest.mark.parametrize("fleet", [("unstamped_stale",)], indirect=True)
def test_k1c_fails_under_the_newest_upstream_rule(fleet: FakeFleet) -> None:
    verdict = only(run(k1c.OldPublisher(fleet.clock), fleet))
    assert not verdict.passed
    assert "the replicas listed: replica-0 0, replica-1 0" in verdict.detail


@pytest.mark.parametrize("fleet", [("keeps_stamp",)], indirect=True)
def test_k1c_fails_when_the_stamp_is_never_cleared(fleet: FakeFleet) -> None:
    verdict = only(run(k1c.OldPublisher(fleet.clock), fleet))
    assert not verdict.passed
    assert "did not clear it" in verdict.detail
    assert fleet.publisher["lanes-b"] == "stamping"


def test_k1c_waits_at_least_a_window_and_a_publish() -> None:
    assert k1c.span(Windows(3, 9)) == 12.0  # scaled 100 s is only 10 s
    assert k1c.span(Windows(30, 90)) == 120.0


# --- K1OUT-01 ----------------------------------------------------------------------------


def test_k1out_passes_through_four_windows(fleet: FakeFleet) -> None:
    verdict = only(run(k1out.ControlPlaneOutage(fleet.clock), fleet))
    assert verdict.passed, verdict
    assert "-> HTTP 201" in verdict.figure
    assert "lease holder replica-0 up in" in verdict.figure
    assert "claim on replica 2 -> HTTP 201" in verdict.detail  # the timeline
    assert verdict.figure.endswith("(it stopped leading and kept serving)")
    assert fleet.control_plane
    assert fleet.operations == ["stop_control_plane", "start_control_plane"]
    assert not fleet.sandboxes


@pytest.mark.parametrize("fleet", [("holder_exits",)], indirect=True)
def test_k1out_fails_when_the_lease_holder_exits(fleet: FakeFleet) -> None:
    verdict = only(run(k1out.ControlPlaneOutage(fleet.clock), fleet))
    assert not verdict.passed
    assert "the lease holder replica-0 was down at t = 0.0 s" in verdict.detail


@pytest.mark.parametrize("fleet", [("proxy_exits",)], indirect=True)
def test_k1out_fails_when_the_proxy_goes_with_the_control_plane(fleet: FakeFleet) -> None:
    verdict = only(run(k1out.ControlPlaneOutage(fleet.clock), fleet))
    assert not verdict.passed
    assert verdict.detail.startswith("the proxy was down at t = 0.0 s")


@pytest.mark.parametrize("fleet", [("no_leader",)], indirect=True)
def test_k1out_fails_when_replica_1_holds_no_lease(fleet: FakeFleet) -> None:
    verdict = only(run(k1out.ControlPlaneOutage(fleet.clock), fleet))
    assert not verdict.passed
    assert verdict.detail.startswith("replica-0 did not lead before the outage")


@pytest.mark.parametrize("fleet", [("outage_hides_b",)], indirect=True)
def test_k1out_fails_when_a_node_leaves_in_the_outage(fleet: FakeFleet) -> None:
    verdict = only(run(k1out.ControlPlaneOutage(fleet.clock), fleet))
    assert not verdict.passed
    assert "listed replica-0: 2/4" in verdict.detail


def test_k1out_fails_a_claim_judged_by_its_status() -> None:
    observed = k1out.Observed(4, "replica-0", down_for=36.0)
    observed.polls.append(
        k1out.Poll(0.5, {"replica-0": True, "replica-1": True}, True, {"replica-0": (4, 2, 6)})
    )
    observed.claim = k1out.Claim(33.0, 503, "", "no warm capacity")
    verdict = k1out.judge(observed, Windows(3, 9))
    assert not verdict.passed
    assert "-> HTTP 503 (no warm capacity)" in verdict.detail


# --- SBL-09, SBL-10 ----------------------------------------------------------------------


def test_per_sandbox_requests_count_only_per_sandbox_routes() -> None:
    assert observe.per_sandbox_requests(METRICS) == 6


def test_sbl_passes_where_reads_ask_only_the_owner_and_pinned_lists_fall_back() -> None:
    fleet = FakeFleet("pinned_fallback")
    verdicts = run(sbl.Resolution(), fleet)
    assert [(v.lane, v.passed) for v in verdicts] == [("SBL-09", True), ("SBL-10", True)]
    assert verdicts[0].figure.startswith("the other node asked in 0 of 6 samples")
    assert not fleet.sandboxes


def test_sbl09_fails_when_a_read_asks_the_other_node() -> None:
    fleet = FakeFleet("asks_other")
    verdict = only(run(sbl.Resolution(), fleet, "SBL-09"))
    assert not verdict.passed
    assert verdict.figure.startswith("the other node asked in 6 of 6 samples")


def test_sbl10_fails_where_the_pinned_list_answers_the_name_s_one_object() -> None:
    fleet = FakeFleet()  # one object per name, the first node's: the Paused claim
    verdict = only(run(sbl.Resolution(), fleet, "SBL-10"))
    assert not verdict.passed
    assert verdict.figure == "the pinned list answered []"
    assert verdict.detail.startswith("the Paused claim is lanes-a ")
    assert verdict.detail.endswith("the name resolved to lanes-a before the Running claim was made")


# --- the catalog -------------------------------------------------------------------------


def test_the_catalog_runs_sbl_first_and_the_outage_after_the_publisher_lanes() -> None:
    ids = [lane.id for lane in catalog.lanes()]
    for lane in ("SBL-09", "SBL-10", "K1B2-01", "K1C-01", "K1OUT-01"):
        assert lane in ids
    assert ids.index("SBL-10") < ids.index("K1B2-01") < ids.index("K1C-01")
    assert ids.index("K1C-01") < ids.index("K1OUT-01")


def test_a_watch_counts_only_what_follows_the_initial_events_bookmark() -> None:
    def line(kind: str, name: str = "", end: bool = False) -> str:
        meta: dict[str, object] = {"name": name, "namespace": "default"}
        if end:
            meta = {"annotations": {"k8s.io/initial-events-end": "true"}}
        return json.dumps({"type": kind, "object": {"metadata": meta, "status": {}}})

    watch = observe.Watch()
    lines = [
        line("ADDED", "x"),
        line("ADDED", "y"),
        line("BOOKMARK", end=True),
        "",
        line("BOOKMARK"),
    ]
    watch.read(iter([*lines, line("DELETED", "x")]), lambda: 1.0)
    assert [e.name for e in watch.opening] == ["default/x", "default/y"]
    assert [(e.type, e.name) for e in watch.after] == [("DELETED", "default/x")]
    assert watch.opened.is_set()
    error = {"type": "ERROR", "object": {"message": "too old resource version"}}
    watch.read(iter([json.dumps(error), line("ADDED", "z")]), lambda: 2.0)
    assert watch.failed == "too old resource version"
    assert len(watch.after) == 1

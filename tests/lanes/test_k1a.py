"""K1A's judgments and bounds, on observations made up to sit just inside and just
outside each bound (the real kit runs them in test_local.py)."""

from __future__ import annotations

import pytest

from sandboxctl.lanes import k1a
from sandboxctl.lanes.k1a import Create, Observed
from sandboxctl.lanes.model import Windows

LOCAL = Windows(publish=3.0, stale_after=9.0)
REFERENCE = Windows(publish=30.0, stale_after=90.0)
VIEWS = ("replica-0 kube", "replica-0 e2b", "replica-1 kube", "replica-1 e2b")
STAMP = 1_000.0


def test_the_leave_bound_scales_with_the_windows_and_holds_the_reference_measure() -> None:
    assert k1a.leave_bound(LOCAL) == (9.0, 14.0)
    low, high = k1a.leave_bound(REFERENCE)
    assert (low, high) == (90.0, 122.0)
    assert low <= 120.771 <= high  # what a run on hardware measured


def _left(*seconds: float) -> Observed:
    observed = Observed(views=VIEWS, last_publish=STAMP)
    observed.left = {view: STAMP + s for view, s in zip(VIEWS, seconds, strict=False)}
    return observed


def test_leaving_inside_the_bound_passes_with_the_last_views_figure() -> None:
    verdict = k1a.judge_left(_left(9.4, 9.6, 9.7, 9.7), LOCAL)
    assert verdict.passed, verdict.detail
    assert verdict.figure == "left 9.7 s after B's last publish (first view 9.4 s)"
    assert verdict.bound == "[9.0 s, 14.0 s]"


@pytest.mark.parametrize(
    ("seconds", "why"),
    [
        ((8.5, 9.7, 9.7, 9.7), "inside the window"),  # a reader that drops B early
        ((9.7, 9.7, 9.7, 14.5), "only 14.5 s"),  # a reader that keeps B too long
        ((9.7, 9.7, 9.7), "stayed in: replica-1 e2b"),  # one view never dropped B
    ],
)
def test_leaving_early_late_or_never_fails(seconds: tuple[float, ...], why: str) -> None:
    verdict = k1a.judge_left(_left(*seconds), LOCAL)
    assert not verdict.passed
    assert why in verdict.detail


def test_no_packet_after_the_margin_passes_and_one_fails() -> None:
    observed = Observed(packets_by_margin=25, packets_after_margin=0, watched_after_margin=20.0)
    verdict = k1a.judge_packets(observed)
    assert verdict.passed
    assert verdict.figure == "25 packets before the window + 2 s, 0 after (over 20.0 s)"
    observed.packets_after_margin = 1
    assert not k1a.judge_packets(observed).passed


def _creates(seconds: float, nodes: tuple[str, ...] = ("lanes-a", "lanes-b")) -> list[Create]:
    return [Create(201, seconds, nodes[i % len(nodes)]) for i in range(k1a.CREATES)]


def test_creates_after_the_window_must_avoid_b_and_keep_the_baselines_pace() -> None:
    observed = Observed(baseline=_creates(0.10), creates_after=_creates(0.12, ("lanes-a",)))
    assert k1a.judge_baseline(observed).passed
    verdict = k1a.judge_creates_after(observed, "lanes-b")
    assert verdict.passed, verdict.detail
    assert "p50 at most 0.450 s (baseline 0.100 s)" in verdict.bound

    observed.creates_after = _creates(0.12)  # half of them sampled B
    assert "15 landed on B" in k1a.judge_creates_after(observed, "lanes-b").detail
    observed.creates_after = _creates(0.6, ("lanes-a",))
    assert "p50 above" in k1a.judge_creates_after(observed, "lanes-b").detail
    observed.creates_after = [*_creates(0.1, ("lanes-a",))[:-1], Create(201, 6.0, "lanes-a")]
    assert "stalled 6.00 s" in k1a.judge_creates_after(observed, "lanes-b").detail


def test_the_baseline_fails_on_a_refused_create_or_a_single_host() -> None:
    refused = _creates(0.1)
    refused[3] = Create(503, 0.1)
    assert "HTTP [503]" in k1a.judge_baseline(Observed(baseline=refused)).detail
    one_host = _creates(0.1, ("lanes-a",))
    assert "both hosts" in k1a.judge_baseline(Observed(baseline=one_host)).detail


def test_the_probe_lane_needs_a_502_and_a_probe_per_id_and_nothing_toward_b() -> None:
    observed = Observed(proxy_statuses=[502] * 20, probes=20, packets_during_probes=0)
    assert k1a.judge_probes(observed).passed
    observed.packets_during_probes = 3
    assert "B was asked" in k1a.judge_probes(observed).detail
    observed = Observed(proxy_statuses=[502] * 19 + [404], probes=0, packets_during_probes=0)
    detail = k1a.judge_probes(observed).detail
    assert "answers [404, 502]" in detail
    assert "probed 0 times" in detail


def test_watches_gone_and_return_are_judged_per_view() -> None:
    assert k1a.judge_deleted(Observed(deleted={"replica-0": 7, "replica-1": 7})).passed
    assert not k1a.judge_deleted(Observed(deleted={"replica-0": 7, "replica-1": 6})).passed
    assert not k1a.judge_deleted(Observed()).passed
    assert k1a.judge_gone(Observed(after_window={"GET replica-0": 404, "DELETE x": 404})).passed
    assert not k1a.judge_gone(Observed(after_window={"GET replica-0": 200})).passed
    assert k1a.return_bound(LOCAL) == 5.0
    assert k1a.judge_returned(Observed(views=VIEWS, returned_after=4.9), LOCAL).passed
    assert not k1a.judge_returned(Observed(views=VIEWS, returned_after=5.2), LOCAL).passed
    assert not k1a.judge_returned(Observed(views=VIEWS), LOCAL).passed

"""``python -m benchmarks --against``: rows matched across runs, figures reduced to ratios.

Only the pure part (``benchmarks.compare``): no benchmark runs here.
"""

from __future__ import annotations

import pytest

from benchmarks.compare import Compared, OneSided, better, compare, figures, ratio, row_keys


def _row(case: str, **figures: object) -> dict[str, object]:
    return {"benchmark": "b", "case": case, **figures}


def test_rows_are_keyed_by_benchmark_case_and_fleet_and_repeats_by_order() -> None:
    rows = [
        {"benchmark": "s", "case": "build", "fleet": "10x2", "p50_ms": 1.0},
        {"benchmark": "s", "case": "build", "fleet": "20x2", "p50_ms": 2.0},
        {"benchmark": "s", "case": "build", "fleet": "20x2", "p50_ms": 3.0},
    ]

    keyed = row_keys(rows)

    assert list(keyed) == [
        (("benchmark", "s"), ("case", "build"), ("fleet", "10x2")),
        (("benchmark", "s"), ("case", "build"), ("fleet", "20x2")),
        (("benchmark", "s"), ("case", "build"), ("fleet", "20x2"), ("#", "1")),
    ]
    assert [row["p50_ms"] for row in keyed.values()] == [1.0, 2.0, 3.0]


def test_figures_are_the_numbers_but_sample_counts_and_verdicts() -> None:
    row = _row("c", p50_ms=2, ratio=0.5, runs=50, met=True, target="p50 <= 5 ms", warm="3/5")

    assert figures(row) == {"p50_ms": 2.0, "ratio": 0.5}


@pytest.mark.parametrize(
    ("figure", "row", "expected"),
    [
        ("p50_ms", {}, "lower"),
        ("ms", {}, "lower"),
        ("rss_mb", {}, "lower"),
        ("ops_per_s", {}, "higher"),
        ("ratio", {"target": "median ratio >= 0.8"}, "higher"),
        ("ratio", {"target": "p50 <= 1 ms"}, None),
        ("growth_mb", {"target": "growth < 50 MB"}, "lower"),
        ("visible", {}, None),
    ],
)
def test_which_way_a_figure_improves(figure: str, row: dict[str, object], expected: str) -> None:
    assert better(figure, row) == expected


def test_ratio_of_zeros() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(0.0, 0.0) == 1.0
    assert ratio(1.0, 0.0) is None


def test_each_figure_is_the_median_of_each_side_and_of_the_per_pair_ratios() -> None:
    # The pairs' ratios (1.1, 0.5, 1.2) have a median (1.1) that is not the ratio of the
    # medians (12/10): a slow pair moves both sides, and the per-pair ratio cancels it.
    pairs = [
        ([_row("c", p50_ms=10.0)], [_row("c", p50_ms=11.0)]),
        ([_row("c", p50_ms=40.0)], [_row("c", p50_ms=20.0)]),
        ([_row("c", p50_ms=5.0)], [_row("c", p50_ms=6.0)]),
    ]

    result = compare(pairs)

    key = (("benchmark", "b"), ("case", "c"))
    assert result.compared == [Compared(key, "p50_ms", "lower", 10.0, 11.0, 1.1, 3)]
    assert result.compared[0].worse
    assert result.one_sided == []


def test_a_pair_missing_a_figure_on_one_side_counts_no_ratio() -> None:
    pairs = [
        ([_row("c", p50_ms=10.0)], [_row("c", p50_ms=5.0)]),
        ([_row("c")], [_row("c", p50_ms=50.0)]),
    ]

    (figure,) = compare(pairs).compared

    assert (figure.before, figure.after, figure.ratio, figure.pairs) == (10.0, 27.5, 0.5, 1)
    assert not figure.worse


def test_rows_and_figures_of_one_side_only_are_listed_as_such() -> None:
    pairs = [
        (
            [_row("gone", p50_ms=1.0), _row("kept", p50_ms=1.0, old_ms=4.0)],
            [_row("kept", p50_ms=1.0, new_ms=2.0), _row("new", ops_per_s=9.0), _row("bare")],
        )
    ]

    result = compare(pairs)

    def key(case: str) -> tuple[tuple[str, str], ...]:
        return (("benchmark", "b"), ("case", case))

    assert result.compared == [Compared(key("kept"), "p50_ms", "lower", 1.0, 1.0, 1.0, 1)]
    assert result.one_sided == [
        OneSided(key("kept"), "new_ms", "after", 2.0, whole_row=False),
        OneSided(key("kept"), "old_ms", "before", 4.0, whole_row=False),
        OneSided(key("new"), "ops_per_s", "after", 9.0, whole_row=True),
        OneSided(key("bare"), None, "after", None, whole_row=True),
        OneSided(key("gone"), "p50_ms", "before", 1.0, whole_row=True),
    ]

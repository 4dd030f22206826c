"""``python -m benchmarks [NAME ...] [--json] [--list] [--against REV [--pairs N]]``: run
benchmarks, print their rows.

Without ``--json`` the rows are one table; figures named ``<stat>_<unit>`` share a ``<stat>``
column and show their unit. With ``--json`` every row is printed as one JSON object per
line as soon as it is measured. With ``--against REV`` each benchmark runs N times on REV's
tree and on the working tree, alternately, and the table compares them (``compare.py``).
Progress goes to stderr. Exit 2 on an unknown NAME or REV.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from benchmarks import BENCHMARKS, Row, compare, load

UNITS = {"ns": "ns", "us": "µs", "ms": "ms", "s": "s", "kb": "KB", "mb": "MB", "gb": "GB"}
LEADING = compare.IDENTITY
TRAILING = ("runs", "target", "met")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description="Run sandboxctl benchmarks."
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help="benchmarks to run (default: all)")
    parser.add_argument("--json", action="store_true", help="print JSON lines, one per row")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument(
        "--against",
        metavar="REV",
        help="compare with commit REV: interleaved runs of REV's tree and the working tree",
    )
    parser.add_argument(
        "--pairs", type=int, default=5, metavar="N", help="before/after pairs (default: 5)"
    )
    args = parser.parse_args(argv)

    if args.list:
        for name, (_, description) in BENCHMARKS.items():
            print(f"{name:<16} {description}")
        return 0
    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        print(
            f"benchmarks: unknown benchmark {', '.join(map(repr, unknown))} "
            f"(known: {', '.join(BENCHMARKS)})",
            file=sys.stderr,
        )
        return 2
    if args.against is not None:
        if args.pairs < 1:
            parser.error("--pairs must be at least 1")
        return _against(args.against, list(dict.fromkeys(args.names) or BENCHMARKS), args.pairs)

    rows: list[Row] = []
    for name in dict.fromkeys(args.names) or BENCHMARKS:
        print(f"benchmarks: running {name} ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        for row in load(name)():
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                rows.append(row)
        print(
            f"benchmarks: {name} took {time.perf_counter() - started:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    if not args.json:
        _console().print(table(rows))
    return 0


def _against(rev: str, names: list[str], pairs: int) -> int:
    result = compare.against(rev, names, pairs)
    if isinstance(result, int):
        return result
    commit, comparison, failures = result
    title = f"{rev} ({commit[:10]}) -> working tree, {pairs} interleaved pairs"
    _console().print(comparison_table(comparison, title))
    for failure in failures:
        print(f"benchmarks: failed: {failure}", file=sys.stderr)
    return 1 if failures else 0


def _console() -> Console:
    console = Console()
    if not console.is_terminal:  # piped or in CI: do not squeeze to 80 columns
        console = Console(width=200)
    return console


def table(rows: Sequence[Row]) -> Table:
    """One rich table for rows of any shape: the union of their keys, in first-seen order."""
    columns: dict[str, None] = dict.fromkeys(LEADING)
    for row in rows:
        for key in row:
            if key not in TRAILING:
                columns[_split_unit(key)[0]] = None
    columns.update(dict.fromkeys(TRAILING))
    used = [c for c in columns if any(_split_unit(k)[0] == c for row in rows for k in row)]

    out = Table(title="sandboxctl benchmarks")
    for column in used:
        out.add_column(column, justify="left" if column in (*LEADING, "target") else "right")
    for row in rows:
        cells = {_split_unit(k)[0]: _cell(v, _split_unit(k)[1]) for k, v in row.items()}
        out.add_row(*(cells.get(column, "") for column in used))
    return out


def comparison_table(comparison: compare.Comparison, title: str) -> Table:
    """Per figure: median before, median after, median of the per-pair ratios; then what
    one side alone reported. A ratio on the worse side of 1 says so (in red)."""
    out = Table(title=title)
    for column in (*LEADING, "figure", "better"):
        out.add_column(column)
    for column in ("before", "after", "after/before", "pairs"):
        out.add_column(column, justify="right")
    arrows = {"lower": "lower ↓", "higher": "higher ↑", None: ""}
    for figure in comparison.compared:
        ratio = "" if figure.ratio is None else f"{figure.ratio:.3f}"
        out.add_row(
            *_identity(figure.key),
            escape(figure.figure),
            arrows[figure.better],
            _number(figure.before),
            _number(figure.after),
            f"[red]{ratio} worse[/]" if figure.worse else ratio,
            str(figure.pairs),
        )
    for alone in comparison.one_sided:
        median = "" if alone.median is None else _number(alone.median)
        out.add_row(
            *_identity(alone.key),
            "(no figures)" if alone.figure is None else escape(alone.figure),
            "",
            median if alone.side == "before" else "",
            median if alone.side == "after" else "",
            f"{alone.side} only" + (" (row)" if alone.whole_row else ""),
            "",
        )
    return out


def _identity(key: compare.RowKey) -> list[str]:
    named = dict(key)
    repeat = f" (#{int(named['#']) + 1})" if "#" in named else ""
    cells = {**named, "case": named.get("case", "") + repeat}
    return [escape(cells.get(column, "")) for column in LEADING]


def _split_unit(key: str) -> tuple[str, str]:
    """``"p50_us"`` -> ``("p50", "µs")``; keys without a known unit suffix are kept whole."""
    if key.endswith("_per_s"):  # a rate: "ops_per_s" -> ("ops", "/s")
        return key.removesuffix("_per_s"), "/s"
    stem, _, suffix = key.rpartition("_")
    if stem and suffix in UNITS:
        return stem, UNITS[suffix]
    return key, ""


def _cell(value: Any, unit: str) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "[green]yes[/]" if value else "[red]no[/]"
    text = _number(value) if isinstance(value, float) else escape(str(value))
    return f"{text} {unit}" if unit else text


def _number(value: float) -> str:
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


if __name__ == "__main__":
    sys.exit(main())

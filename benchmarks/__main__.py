"""``python -m benchmarks [NAME ...] [--json] [--list]``: run benchmarks, print their rows.

Without ``--json`` the rows are one table; figures named ``<stat>_<unit>`` share a ``<stat>``
column and show their unit. With ``--json`` every row is printed as one JSON object per
line as soon as it is measured. Progress goes to stderr. Exit 2 on an unknown NAME.
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

from benchmarks import BENCHMARKS, Row, load

UNITS = {"ns": "ns", "us": "µs", "ms": "ms", "s": "s", "kb": "KB", "mb": "MB", "gb": "GB"}
LEADING = ("benchmark", "case", "fleet")
TRAILING = ("runs", "target", "met")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description="Run sandboxctl benchmarks."
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help="benchmarks to run (default: all)")
    parser.add_argument("--json", action="store_true", help="print JSON lines, one per row")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
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
        console = Console()
        if not console.is_terminal:  # piped or in CI: do not squeeze to 80 columns
            console = Console(width=200)
        console.print(table(rows))
    return 0


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

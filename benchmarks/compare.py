"""``python -m benchmarks --against REV --pairs N [NAME ...]``: before/after, interleaved.

REV's whole tree is extracted (``oldtree.extract``) into a temporary directory outside the
repository. For each benchmark, N pairs of runs alternate between that tree (before) and
the working tree (after), each run its own ``python -m benchmarks --json NAME`` with the
tree as its working directory and first on ``PYTHONPATH``. The editable install's finder
sits after the path finder on ``sys.meta_path``, so the tree on the path wins, also in the
processes a benchmark starts; a probe in the same environment checks which ``sandboxctl``
and ``benchmarks`` each side imports before anything is measured.

A benchmark REV does not register runs on REV's ``sandboxctl`` with this tree's
``benchmarks`` package; if that fails it is reported as after only.

Rows are matched by :data:`IDENTITY` (and their order among rows of the same identity);
every numeric figure gets the median before, the median after and the median of the
per-pair ratios after/before. Rows or figures seen on one side only are listed as such.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from benchmarks import Row, oldtree

# What names a row, in every benchmark (``benchmarks.__main__`` leads its table with it).
IDENTITY = ("benchmark", "case", "fleet")
# Numbers a row carries that are not figures: how many samples it took.
NOT_FIGURES = frozenset({"runs"})
TIME_UNITS = frozenset({"ns", "us", "ms", "s"})
SIZE_UNITS = frozenset({"kb", "mb", "gb"})
WORKING_TREE = Path(__file__).resolve().parents[1]

RowKey = tuple[tuple[str, str], ...]
Better = Literal["lower", "higher"] | None
Side = Literal["before", "after"]


# --- matching and ratios (pure) -----------------------------------------------------------


def row_keys(rows: Iterable[Row]) -> dict[RowKey, Row]:
    """Rows of one run by identity; a repeated identity gets its occurrence number."""
    keyed: dict[RowKey, Row] = {}
    seen: dict[RowKey, int] = {}
    for row in rows:
        key = tuple((name, str(row[name])) for name in IDENTITY if name in row)
        count = seen.get(key, 0)
        seen[key] = count + 1
        keyed[(*key, ("#", str(count))) if count else key] = row
    return keyed


def figures(row: Row) -> dict[str, float]:
    """The row's numeric figures (booleans such as ``met`` and sample counts are not)."""
    return {
        name: float(value)
        for name, value in row.items()
        if isinstance(value, int | float)
        and not isinstance(value, bool)
        and name not in NOT_FIGURES
        and name not in IDENTITY
    }


def better(figure: str, row: Row) -> Better:
    """Which way a figure improves: from the row's ``target`` when it names the figure
    (``"p50 <= 5 ms"``, ``"median ratio >= 0.8"``), else from its unit (times and sizes
    lower, ``_per_s`` rates higher); None when neither says."""
    stem, _, unit = figure.rpartition("_")
    if figure.endswith("_per_s"):
        stem, unit = figure.removesuffix("_per_s"), "per_s"
    elif not stem:  # a bare unit ("ms") is a time or size too
        stem, unit = figure, figure
    target = row.get("target")
    if isinstance(target, str):
        said = re.search(rf"\b{re.escape(stem)}\s*(<=?|>=?)", target)
        if said:
            return "lower" if said.group(1).startswith("<") else "higher"
    if unit in TIME_UNITS or unit in SIZE_UNITS:
        return "lower"
    if unit == "per_s":
        return "higher"
    return None


def ratio(after: float, before: float) -> float | None:
    """after/before; equal zeros are 1, a zero before with a nonzero after has none."""
    if before == 0:
        return 1.0 if after == 0 else None
    return after / before


@dataclass(frozen=True, slots=True)
class Compared:
    """One figure of one row, on both sides."""

    key: RowKey
    figure: str
    better: Better
    before: float
    after: float
    ratio: float | None  # median of the per-pair after/before; None when no pair has both
    pairs: int

    @property
    def worse(self) -> bool:
        if self.ratio is None or self.better is None:
            return False
        return self.ratio > 1 if self.better == "lower" else self.ratio < 1


@dataclass(frozen=True, slots=True)
class OneSided:
    """A figure that only one side reported, or a row without figures."""

    key: RowKey
    figure: str | None  # None: a row without figures
    side: Side
    median: float | None
    whole_row: bool  # the other side has no such row (else only this figure is missing)


@dataclass(slots=True)
class Comparison:
    compared: list[Compared] = field(default_factory=list)
    one_sided: list[OneSided] = field(default_factory=list)

    def alone(self, key: RowKey, side: Side, rows: Sequence[Row | None]) -> None:
        """A row only ``side`` has: each of its figures, with its median on that side."""
        names = dict.fromkeys(name for row in rows for name in figures(row or {}))
        for name in names:
            values = [value for value in _values(rows, name) if value is not None]
            self.one_sided.append(OneSided(key, name, side, statistics.median(values), True))
        if not names:
            self.one_sided.append(OneSided(key, None, side, None, True))

    def add(
        self,
        key: RowKey,
        name: str,
        example: Row,
        before: Sequence[float | None],
        after: Sequence[float | None],
    ) -> None:
        """One figure of a row both sides have, its values per pair (None where missing)."""
        seen_before = [value for value in before if value is not None]
        seen_after = [value for value in after if value is not None]
        if not seen_before:
            self.one_sided.append(
                OneSided(key, name, "after", statistics.median(seen_after), False)
            )
            return
        if not seen_after:
            self.one_sided.append(
                OneSided(key, name, "before", statistics.median(seen_before), False)
            )
            return
        ratios = [
            r
            for b, a in zip(before, after, strict=True)
            if b is not None and a is not None and (r := ratio(a, b)) is not None
        ]
        self.compared.append(
            Compared(
                key=key,
                figure=name,
                better=better(name, example),
                before=statistics.median(seen_before),
                after=statistics.median(seen_after),
                ratio=statistics.median(ratios) if ratios else None,
                pairs=len(ratios),
            )
        )


def compare(pairs: Sequence[tuple[Sequence[Row], Sequence[Row]]]) -> Comparison:
    """Match the rows of each (before, after) pair of runs and reduce every figure."""
    before_runs = [row_keys(before) for before, _ in pairs]
    after_runs = [row_keys(after) for _, after in pairs]
    order: dict[RowKey, None] = {}  # the current rows' order leads; rows gone follow
    for run in (*after_runs, *before_runs):
        order.update(dict.fromkeys(run))

    out = Comparison()
    for key in order:
        before = [run.get(key) for run in before_runs]
        after = [run.get(key) for run in after_runs]
        if not any(before) or not any(after):
            out.alone(key, "after" if any(after) else "before", after if any(after) else before)
            continue
        examples: dict[str, Row] = {}  # figure -> a row that has it (its target says more)
        for row in (*after, *before):
            for name in figures(row or {}):
                examples.setdefault(name, row or {})
        for name, example in examples.items():
            out.add(key, name, example, _values(before, name), _values(after, name))
    return out


def _values(rows: Sequence[Row | None], name: str) -> list[float | None]:
    """One figure across the runs of one side; None where a run lacks it."""
    return [figures(row).get(name) if row else None for row in rows]


# --- the runs -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tree:
    """Where one side's ``python -m benchmarks`` runs, and the environment it runs in."""

    name: Side
    root: Path
    env: dict[str, str]

    def run(self, benchmark: str, pair: str) -> tuple[list[Row], str | None]:
        """One run of one benchmark: its rows, and why it failed (or None)."""
        print(f"benchmarks: {benchmark} {self.name}, pair {pair}", file=sys.stderr, flush=True)
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks", "--json", benchmark],
            cwd=self.root,
            env=self.env,
            stdout=subprocess.PIPE,
            text=True,
        )
        rows = []
        for line in done.stdout.splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # something else the benchmark printed
            if isinstance(row, dict):
                rows.append(row)
        return rows, None if done.returncode == 0 else f"exit {done.returncode}"

    def check_imports(self) -> str | None:
        """None when this tree's ``sandboxctl`` and ``benchmarks`` are the ones imported."""
        probe = (
            "import benchmarks, sandboxctl; print(sandboxctl.__file__); print(benchmarks.__file__)"
        )
        done = subprocess.run(
            [sys.executable, "-c", probe],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            return f"cannot import from {self.root}: {done.stderr.strip()}"
        for path in done.stdout.split():
            print(f"benchmarks: {self.name} imports {path}", file=sys.stderr, flush=True)
            if not Path(path).resolve().is_relative_to(self.root.resolve()):
                return f"{self.name} imports {path}, not from {self.root}"
        return None

    def registered(self) -> set[str]:
        listed = subprocess.run(
            [sys.executable, "-m", "benchmarks", "--list"],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
        )
        return {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}


def tree(root: Path, *, after: bool = False) -> Tree:
    """A side run from ``root``, first on the path (with its ``testing/`` doubles, if any)."""
    path = [str(root)]
    if (root / "testing").is_dir():
        path.append(str(root / "testing"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    if not after:
        # A benchmark that runs an older build beside its own (store, tenancy) finds the
        # repository through git; an extracted tree has none.
        git_dir = subprocess.run(
            ["git", "rev-parse", "--absolute-git-dir"],
            cwd=WORKING_TREE,
            capture_output=True,
            text=True,
        ).stdout.strip()
        if git_dir:
            env["GIT_DIR"] = git_dir
    return Tree("after" if after else "before", root, env)


def resolve(rev: str) -> str | None:
    """REV's full commit id, or None when the repository has no such commit."""
    done = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        cwd=WORKING_TREE,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() if done.returncode == 0 else None


def against(rev: str, names: Sequence[str], pairs: int) -> tuple[str, Comparison, list[str]] | int:
    """REV's commit, the comparison and the runs that failed; or the exit status when
    nothing could be compared (2: REV is unknown)."""
    commit = resolve(rev)
    if commit is None:
        print(f"benchmarks: unknown revision {rev!r}", file=sys.stderr)
        return 2
    failures: list[str] = []
    comparison = Comparison()
    with tempfile.TemporaryDirectory(prefix="sandboxctl-against-") as folder:
        old_root = Path(folder) / "before"
        old_root.mkdir()
        why = oldtree.extract(commit, old_root, (".",))
        if why:
            print(f"benchmarks: {why}", file=sys.stderr)
            return 1
        before, after = tree(old_root), tree(WORKING_TREE, after=True)
        for side in (before, after):
            wrong = side.check_imports()
            if wrong:
                print(f"benchmarks: {wrong}", file=sys.stderr)
                return 1
        registered = before.registered()
        for name in names:
            if name in registered:
                runs, failed = _pairs(before, after, name, pairs, borrowed=False)
            else:
                borrowed = _with_current_benchmarks(old_root, Path(folder) / "borrowed")
                runs, failed = _pairs(borrowed, after, name, pairs, borrowed=True)
            failures += failed
            result = compare(runs)
            comparison.compared += result.compared
            comparison.one_sided += result.one_sided
    return commit, comparison, failures


def _pairs(
    before: Tree, after: Tree, name: str, pairs: int, *, borrowed: bool
) -> tuple[list[tuple[list[Row], list[Row]]], list[str]]:
    """Before, after, before, after...; with a ``borrowed`` benchmark (this tree's, on the
    old code) a first before run that fails drops the before side: it reads as after only."""
    runs: list[tuple[list[Row], list[Row]]] = []
    failures: list[str] = []
    before_runs = True
    for pair in range(pairs):
        counted = f"{pair + 1}/{pairs}"
        old_rows: list[Row] = []
        if before_runs:
            old_rows, failed = before.run(name, counted)
            if failed and borrowed and pair == 0:
                print(
                    f"benchmarks: {name} does not run on the old code with this tree's "
                    f"benchmarks ({failed}): after only",
                    file=sys.stderr,
                )
                before_runs, old_rows = False, []
            elif failed:
                failures.append(f"{name} before, pair {pair + 1}: {failed}")
        new_rows, failed = after.run(name, counted)
        if failed:
            failures.append(f"{name} after, pair {pair + 1}: {failed}")
        runs.append((old_rows, new_rows))
    return runs, failures


def _with_current_benchmarks(old_root: Path, into: Path) -> Tree:
    """The old tree with this tree's ``benchmarks`` package (for a benchmark REV lacks)."""
    if not into.exists():
        shutil.copytree(
            old_root,
            into,
            symlinks=True,
            ignore=lambda folder, _: ["benchmarks"] if Path(folder) == old_root else [],
        )
        shutil.copytree(
            WORKING_TREE / "benchmarks",
            into / "benchmarks",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    return tree(into)

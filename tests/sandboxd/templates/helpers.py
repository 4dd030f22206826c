"""Running the ``template`` verbs as a user does, and reading what a store holds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def sandboxctl(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandboxctl", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def store_entries(store: Path) -> dict[str, list[str]]:
    """What a store holds: its builds, its template files, and anything else at its top
    (a scratch directory a build left, say) but the lock."""

    def names(directory: Path, skip: tuple[str, ...] = ()) -> list[str]:
        # pathlib's glob matches dot files too: a leftover ".build-*" shows
        return sorted(p.name for p in directory.glob("*") if p.name not in (*skip, ".lock"))

    return {
        "top": names(store, ("builds", "templates")),
        "builds": names(store / "builds"),
        "templates": names(store / "templates"),
    }

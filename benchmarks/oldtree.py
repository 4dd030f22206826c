"""An older commit's trees, extracted beside the running one, so that a benchmark can run
the old build and the new one side by side in one run (``git archive`` of this
repository; nothing is fetched)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def extract(commit: str, into: Path, paths: tuple[str, ...] = ("sandboxctl",)) -> str | None:
    """Extract ``paths`` of ``commit`` into ``into``; None, or why it could not."""
    here = Path(__file__).resolve().parent
    git = shutil.which("git")
    if git is None:
        return "git is not installed"
    top = subprocess.run(
        [git, "rev-parse", "--show-toplevel"], cwd=here, capture_output=True, text=True
    )
    if top.returncode != 0:
        return f"not a git checkout ({top.stderr.strip()})"
    archive = subprocess.run(
        [git, "archive", commit, *paths], cwd=top.stdout.strip(), capture_output=True
    )
    if archive.returncode != 0:
        return f"git archive {commit}: {archive.stderr.decode().strip()}"
    try:
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    except (OSError, subprocess.CalledProcessError) as error:
        return f"extracting {commit}: {error}"
    return None

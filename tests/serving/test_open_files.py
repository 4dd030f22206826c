"""The connection limit fits the process's open-file limit: raised as far as the hard
limit allows, or the connections per listener lowered, with a warning, when even that is
short (each connection may cost two files: its socket and what serving it opens)."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

HARD = resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # not to be raised, even by root
NEEDED = 2 * 2 * 4096 + 1024  # 2 listeners of 4096 connections, 2 files each, and 1024

FIT = """
import logging, resource, sys
from sandboxctl.serving.bounds import ReadBounds, fit_open_files
logging.basicConfig(format="%(levelname)s %(message)s")
soft, hard = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
fitted = fit_open_files(ReadBounds(max_connections=4096), 2)
print(fitted.max_connections, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


def _fit(soft: int, hard: int) -> tuple[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", FIT, str(soft), str(hard)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.strip(), done.stderr.strip()


@pytest.mark.skipif(
    HARD != resource.RLIM_INFINITY and HARD < NEEDED,
    reason=f"the hard open-file limit here is {HARD}, below {NEEDED}",
)
def test_the_soft_open_file_limit_is_raised_as_far_as_needed() -> None:
    assert _fit(1024, HARD) == (f"4096 {NEEDED}", "")


def test_a_short_open_file_limit_lowers_the_connections_with_a_warning() -> None:
    # (1024 - 512 kept for the process's own files) / (2 listeners x 2 files)
    assert _fit(1024, 1024) == (
        "128 1024",
        "WARNING this process may open 1024 files (RLIMIT_NOFILE; LimitNOFILE= in a systemd "
        "unit): each of its 2 listeners holds at most 128 connections, not 4096 "
        "(--max-connections)",
    )

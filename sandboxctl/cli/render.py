"""Output shared by the verbs."""

from __future__ import annotations

import sys

from rich.console import Console

# Logs and pipes have no width; 80 columns would fold every table row in a cron log.
PIPE_WIDTH = 200


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else PIPE_WIDTH
    return Console(file=stream, highlight=False, width=width, soft_wrap=width is not None)

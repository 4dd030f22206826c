"""The runner's :class:`~sandboxctl.lanes.model.Progress`: a rich spinner line while a lane
waits (what it waits for, the elapsed time, the bound), and one line per note. Written to
stderr, so that ``-o json`` leaves stdout to the report."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn

from sandboxctl.lanes.model import LaneTimeout

T = TypeVar("T")

POLL = 0.1  # seconds between checks (the model's contract)


class ConsoleProgress:
    def __init__(self, console: Console | None = None, clock: Callable[[], float] = time.monotonic):
        self.console = console or Console(stderr=True, highlight=False)
        self.clock = clock

    def wait_for(self, what: str, check: Callable[[], T | None], bound: float) -> T:
        started = self.clock()
        columns = (
            SpinnerColumn(),
            TextColumn("waiting for {task.description}"),
            TextColumn("{task.fields[elapsed]:.1f} s of {task.fields[bound]:.1f} s"),
        )
        # A live line only on a terminal: in a log it would leave a blank line per wait.
        live = Progress(
            *columns, console=self.console, transient=True, disable=not self.console.is_terminal
        )
        with live as bar:
            task = bar.add_task(what, elapsed=0.0, bound=bound)
            while True:
                value = check()
                elapsed = self.clock() - started
                if value is not None and value is not False:
                    self.console.print(
                        f"  {what}: {elapsed:.1f} s (bound {bound:.1f} s)", style="dim"
                    )
                    return value
                if elapsed > bound:
                    raise LaneTimeout(f"waited {bound:.1f} s for {what}")
                bar.update(task, elapsed=elapsed)
                time.sleep(POLL)

    def note(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False)

"""What a template build shows while it runs: on a terminal a rich progress bar of its
steps with the time so far; elsewhere (a log, a pipe, CI) one line per step, so a slow
first build says what it is waiting for."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)


class Reporter(Protocol):
    def begin(self, steps: int) -> None:
        """A build of ``steps`` steps starts."""
        ...

    def step(self, text: str) -> None:
        """The next step starts (the one before it is done)."""
        ...

    def detail(self, line: str) -> None:
        """A line of output of the step (a run command's)."""
        ...

    def end(self) -> None:
        """The build is over, done or not."""
        ...


class Quiet:
    """Shows nothing (a cached template, tests)."""

    def begin(self, steps: int) -> None:
        pass

    def step(self, text: str) -> None:
        pass

    def detail(self, line: str) -> None:
        pass

    def end(self) -> None:
        pass


class Lines:
    """``NAME: step 3/6: installing packages (12.4s)``, one line per step, through ``say``."""

    def __init__(self, name: str, say: Callable[[str], None]) -> None:
        self._name = name
        self._say = say
        self._steps = 0
        self._done = 0
        self._started = time.monotonic()

    def begin(self, steps: int) -> None:
        self._steps = steps
        self._started = time.monotonic()

    def step(self, text: str) -> None:
        self._done += 1
        elapsed = time.monotonic() - self._started
        self._say(f"{self._name}: step {self._done}/{self._steps}: {text} ({elapsed:.1f}s)")

    def detail(self, line: str) -> None:
        self._say(f"{self._name}:   {line}")

    def end(self) -> None:
        pass


class Bar:
    """A rich progress bar on a terminal: the step, a bar of steps, the time so far."""

    def __init__(self, name: str, console: Console) -> None:
        self._name = name
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.fields[name]}[/] {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        self._task = self._progress.add_task("starting", total=None, name=name)
        self._started = False
        self._done = -1  # the first step starts with none done

    def begin(self, steps: int) -> None:
        self._progress.update(self._task, total=steps, completed=0)
        if not self._started:
            self._progress.start()
            self._started = True

    def step(self, text: str) -> None:
        self._done += 1
        self._progress.update(self._task, description=text, completed=self._done)

    def detail(self, line: str) -> None:
        self._progress.console.print(f"  {line}", style="dim", markup=False, highlight=False)

    def end(self) -> None:
        if self._started:
            task = self._progress.tasks[0]
            self._progress.update(self._task, completed=task.total or task.completed)
            self._progress.stop()


def reporter(name: str, console: Console, say: Callable[[str], None]) -> Reporter:
    """A bar on a terminal, else lines through ``say``."""
    return Bar(name, console) if console.is_terminal else Lines(name, say)

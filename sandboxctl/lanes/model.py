"""What a lane is and what it yields. Pure data: no I/O."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from sandboxctl.core.errors import ConfigurationError

if TYPE_CHECKING:
    from sandboxctl.lanes.kit import Kit

T = TypeVar("T")

LOCAL = "local"
EXTERNAL = "external"
KITS = (LOCAL, EXTERNAL)


@dataclass(frozen=True)
class Lane:
    """One pass criterion: ``id`` (K1A-03), ``group`` (K1A), what it proves, the kits it
    can run on, and the kit operations its scenario calls (names of :class:`Kit`'s fault
    and fact methods, e.g. ``kill_host``), so that an external kit whose file lacks one
    is refused before anything runs."""

    id: str
    group: str
    proves: str
    kits: frozenset[str] = frozenset(KITS)
    needs: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Verdict:
    """A lane's result: PASS or FAIL, the figure it measured and the bound it was judged
    against, both as a reader should see them ("left 9.7 s after B's last publish",
    "[9.0 s, 13.0 s]"). ``detail`` says why a FAIL failed."""

    lane: str
    passed: bool
    figure: str
    bound: str
    detail: str = ""
    seconds: float = 0.0  # the lane's own wall time, set by the runner


@dataclass(frozen=True)
class Windows:
    """The fleet's timing: hosts publish every ``publish`` seconds and readers drop a node
    whose publish trails the newest by more than ``stale_after``. Every bound a lane
    states is derived from these, so scaled windows scale the bounds."""

    publish: float
    stale_after: float

    def scaled(self, reference_seconds: float) -> float:
        """A duration at production's 30 s publish, scaled to these windows."""
        return reference_seconds * self.publish / 30.0


class Progress(Protocol):
    """How a scenario waits and speaks: the runner shows what it waits for, the elapsed
    time and the bound, and stops waiting at the bound."""

    def wait_for(self, what: str, check: Callable[[], T | None], bound: float) -> T:
        """Poll ``check`` (every 0.1 s) until it returns something other than None or
        False; raise :class:`LaneTimeout` after ``bound`` seconds."""
        ...

    def note(self, text: str) -> None:
        """One line of what the scenario is doing now."""
        ...


class Scenario(Protocol):
    """The actions behind a group of lanes. ``run`` yields a verdict for every lane of
    ``selected`` (a subset of ``lanes``), in the lanes' order; it may skip the actions no
    selected lane needs. It leaves the kit as it found it or says so by raising (the
    runner then heals the kit before the next scenario)."""

    lanes: tuple[Lane, ...]

    def run(self, kit: Kit, selected: frozenset[str], progress: Progress) -> Iterable[Verdict]: ...


class LaneError(ConfigurationError):
    """A lane selector, kit or configuration that cannot run (CLI: one line, exit 2), or a
    step a scenario cannot take (the runner fails the lane with this message)."""


class KitDown(LaneError):
    """The kit did not come up (the local kit did not start, an external fleet did not
    answer before the first lane) or did not go down: a failed run (exit 1), not bad
    input."""


class LaneTimeout(LaneError):
    """A wait reached its bound; the scenario's current lane fails with this message."""

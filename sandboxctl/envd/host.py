"""What envd needs from the host agent that serves it, declared here so that envd imports
nothing from the agent: the agent passes an object that satisfies :class:`Sandboxes`
(``sandboxctl.sandboxd.envd_host``), and tests may pass any other.

The sandbox's user and home are part of the e2b contract envd serves (the SDK's default
user is ``user``, relative paths start at ``/home/user``), so they are defined here and
the runtimes build their sandboxes to match.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

SANDBOX_USER = "user"
SANDBOX_HOME = "/home/user"


class SandboxUnavailable(Exception):
    """No running sandbox has this id: unknown, released, or ``paused``. ``message`` is
    what envd answers, in the words the e2b SDK expects."""

    def __init__(self, sandbox_id: str, paused: bool = False) -> None:
        self.sandbox_id = sandbox_id
        self.paused = paused
        state = "is paused" if paused else "was not found"
        self.message = f"The sandbox {sandbox_id} {state}"
        super().__init__(self.message)


class RunningSandbox(Protocol):
    """One running sandbox: how to start a command inside it and find and signal it."""

    @property
    def id(self) -> str: ...

    @property
    def env(self) -> Mapping[str, str]:
        """The env vars of the sandbox's claim, set for every command under its own."""
        ...

    def enter_command(self, argv: Sequence[str]) -> list[str]:
        """The host command line that runs ``argv`` inside the sandbox (may block)."""
        ...

    def process_env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        """The whole environment to spawn that command line with, ``extra`` on top."""
        ...

    def entered(self, leader: int) -> tuple[int, int] | None:
        """(host pid, pid inside the sandbox) of the command spawned as ``leader``, or
        None while it is not inside yet. A runtime without pid namespaces answers
        ``(leader, leader)`` at once."""
        ...

    def signal_command(self, pgid: int, sig: int) -> None:
        """Signal every process of a command spawned in a session of its own (``pgid``
        is the pid spawned); one already gone is not an error."""
        ...

    def log(self, message: str, level: str = "info", **fields: str) -> None:
        """Add an event to the sandbox's log (a command started or ended)."""
        ...


class Sandboxes(Protocol):
    """The agent's sandboxes, as envd looks them up for each request."""

    def running(self, sandbox_id: str) -> RunningSandbox:
        """The running sandbox ``sandbox_id``; SandboxUnavailable when there is none."""
        ...

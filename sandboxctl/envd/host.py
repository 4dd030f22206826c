"""What envd needs from the host agent that serves it, declared here so that envd imports
nothing from the agent: the agent passes an object that satisfies :class:`Sandboxes`
(``sandboxctl.sandboxd.envd_host``), and tests may pass any other.

The sandbox's user and home are part of the e2b contract envd serves (the SDK's default
user is ``user``, relative paths start at ``/home/user``), so they are defined here and
the runtimes build their sandboxes to match.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

SANDBOX_USER = "user"
SANDBOX_HOME = "/home/user"
# What a command's stdin is: a pipe the caller writes to, /dev/null, or the terminal it
# was given as its stdout and stderr.
Stdin = Literal["pipe", "null", "terminal"]


@dataclass(frozen=True, slots=True)
class Command:
    """A command to run inside a sandbox, as a client asked for it: every field may be
    hostile, so none of it may become an argument, variable or file of a host process."""

    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)  # on top of the sandbox's own
    cwd: str = SANDBOX_HOME
    stdin: Stdin = "null"
    # For the agent's own ``/bin/sh -c SCRIPT [NAME [ARGS...]]``: the shell that enters
    # the sandbox runs SCRIPT itself, one program less (its $0 is that shell's).
    inline_shell: bool = False


@dataclass(frozen=True, slots=True)
class Entry:
    """How the host starts a :class:`Command`: ``argv`` and ``env`` are the runtime's own
    fixed text and carry nothing of the command. The command itself is ``script``, which
    the caller writes to the process's stdin first (before any input of its own): the
    shell that reads it runs inside the sandbox, as the sandbox's uid."""

    argv: Sequence[str]
    env: Mapping[str, str]
    script: bytes


@dataclass(frozen=True, slots=True)
class StartedCommand:
    """A command envd started, as the agent keeps it across its own restarts: what
    ``commands.list()`` shows of it, and how the agent finds it again. A sandbox left
    running by an agent that stopped (``--keep-sandboxes``) keeps its commands; the next
    agent process lists and signals them from this."""

    pid: int  # inside the sandbox: what the client sees
    leader: int  # the host process spawned: the command's process group
    host_pid: int  # the command's own host pid
    session: int | None  # with a pty: the command's own session (its host pid)
    config: Mapping[str, Any]  # cmd, args, envs, cwd, as the client asked
    tag: str | None = None


class BadCommand(ValueError):
    """A command that cannot be passed on as it is (a NUL byte, text that is not
    UTF-8, a variable name a shell cannot set); the message names the field only."""


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

    def enter(self, command: Command) -> Entry:
        """How to start ``command`` inside the sandbox, the claim's env under its own
        (may block; BadCommand for a command that cannot be passed on)."""
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

    def remember(self, command: StartedCommand) -> None:
        """Keep ``command`` where the agent's next process finds it, until :meth:`forget`
        (may block briefly)."""
        ...

    def forget(self, pid: int) -> None:
        """The command ``pid`` has ended: no longer remembered."""
        ...

    def remembered(self, skip: Collection[int] = ()) -> list[StartedCommand]:
        """The remembered commands of this sandbox (but those whose pid is in ``skip``)
        that still run in it, each checked to be the very process that was started, in
        this sandbox; what an earlier agent process started is among them (may block)."""
        ...

    def signal_remembered(self, command: StartedCommand, sig: int) -> bool:
        """Signal a command :meth:`remembered` gave: its processes in this sandbox, never
        a process that recycled one of its pids; False when it has ended (may block)."""
        ...


class Sandboxes(Protocol):
    """The agent's sandboxes, as envd looks them up for each request."""

    def running(self, sandbox_id: str) -> RunningSandbox:
        """The running sandbox ``sandbox_id``; SandboxUnavailable when there is none."""
        ...

"""One sandbox as envd sees it: how to run a command inside it and signal that command."""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import signal
from collections.abc import Sequence
from dataclasses import dataclass, replace

from sandboxctl.envd.connect import ConnectError
from sandboxctl.envd.host import SANDBOX_HOME, Command, RunningSandbox, SandboxUnavailable
from sandboxctl.envd.hostprocess import HostProcess, spawn

HOME = SANDBOX_HOME
# How long a command may take to appear inside a (loaded) sandbox.
ENTER_SECONDS = 10.0
ENTER_POLL_SECONDS = 0.001
_TASKS: set[asyncio.Task[None]] = set()


@dataclass(frozen=True, slots=True)
class Target:
    sandbox: RunningSandbox

    @property
    def id(self) -> str:
        return self.sandbox.id

    def log(self, message: str, level: str = "info", **fields: str) -> None:
        self.sandbox.log(message, level, **fields)

    async def spawn(self, command: Command, terminal: int | None = None) -> HostProcess:
        """Start ``command`` inside the sandbox, in a session of its own; with
        ``terminal`` (a pty's follower fd) as its stdin, stdout and stderr. Raises
        SandboxUnavailable when the sandbox is gone, BadCommand for a command the
        runtime cannot pass on."""
        return (await self._spawn(command, terminal, wait_entered=False)).process

    async def start(self, command: Command, terminal: int | None = None) -> Started:
        """``spawn``, letting the command run only once it is inside the sandbox, so that
        its pid there is known even if it ends at once."""
        return await self._spawn(command, terminal, wait_entered=True)

    async def _spawn(self, command: Command, terminal: int | None, wait_entered: bool) -> Started:
        if terminal is not None:
            command = replace(command, stdin="terminal")
        entry = await asyncio.to_thread(self.sandbox.enter, command)
        # Its stdin takes the entry's script first, then the command's own input if any.
        process = await spawn(entry.argv, entry.env, terminal)
        try:
            host_pid = pid = process.pid
            if wait_entered:
                host_pid, pid = await self._entered(process)
            await _write_script(process, entry.script, keep_open=command.stdin == "pipe")
        except BaseException:  # also the caller hanging up, whose cancellation would
            self.kill_soon(process)  # interrupt an await here
            raise
        return Started(process, host_pid, pid)

    async def _entered(self, process: HostProcess) -> tuple[int, int]:
        """(host pid, pid inside the sandbox) of a command just spawned, once it is there,
        waiting for its script: the pid ``ps`` and ``$$`` show in the sandbox."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ENTER_SECONDS
        while process.returncode is None and loop.time() < deadline:
            found = self.sandbox.entered(process.pid)
            if found is not None:
                return found
            await asyncio.sleep(ENTER_POLL_SECONDS)
        if process.returncode is None:
            raise ConnectError(
                "unavailable", f"the command did not start within {ENTER_SECONDS:g}s"
            )
        raise SandboxUnavailable(self.id)

    async def run(
        self, argv: Sequence[str], stdin: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        """Run ``argv`` inside the sandbox to completion: (exit status, stdout, stderr)."""
        command = Command(argv, stdin="pipe" if stdin is not None else "null")
        process = await self.spawn(command)
        try:
            out, err = await process.communicate(stdin)
        except BaseException:
            await self.kill(process)
            raise
        return process.returncode if process.returncode is not None else -1, out, err

    async def kill(self, process: HostProcess, session: int | None = None) -> None:
        if process.returncode is None:
            await asyncio.to_thread(self.signal, process.pid, signal.SIGKILL, session)
            with contextlib.suppress(ProcessLookupError):
                process.kill()  # nsenter itself, once its child is gone or never started
            await process.wait()

    def kill_soon(self, process: HostProcess, session: int | None = None) -> None:
        """``kill`` in a task of its own: safe in a ``finally`` of a stream the client cut
        off, where anyio's cancellation would interrupt any await."""
        if process.returncode is None:
            task = asyncio.get_running_loop().create_task(self.kill(process, session))
            _TASKS.add(task)
            task.add_done_callback(_TASKS.discard)

    def signal(self, pgid: int, sig: int, session: int | None = None) -> None:
        """Signal every process of a command started by ``spawn`` (``pgid``: its pid),
        and of ``session``, the host pid of a command that made a session of its own
        (one with a terminal: its process group has that id)."""
        self.sandbox.signal_command(pgid, sig)
        if session is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(session, sig)


@dataclass(frozen=True, slots=True)
class Started:
    """A command ``Target.start`` started: the process spawned on the host (what is
    signalled and waited for), the command's own host pid, and its pid inside the
    sandbox (what the client sees)."""

    process: HostProcess
    host_pid: int
    pid: int


async def _write_script(process: HostProcess, script: bytes, keep_open: bool) -> None:
    stdin = process.stdin
    assert stdin is not None
    try:
        stdin.write(script)
        await stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        return  # it ended before reading it: its exit status says why
    if not keep_open:
        stdin.close()


def sandbox_path(path: str | None, default: str | None = None) -> str:
    """An absolute, normalised sandbox path; relative paths start at /home/user.

    ``..`` that would climb above / is refused. Symlinks are left to the kernel: every
    operation runs inside the sandbox, where they cannot lead to the host.
    """
    if not path:
        if default is None:
            raise ConnectError("invalid_argument", "path is required")
        path = default
    if "\0" in path:
        raise ConnectError("invalid_argument", "path contains a NUL byte")
    if path == "~" or path.startswith("~/"):
        path = HOME + path[1:]
    if not path.startswith("/"):
        path = f"{HOME}/{path}"
    depth = 0
    for part in path.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                raise ConnectError("invalid_argument", f"path escapes the sandbox root: {path}")
        elif part not in ("", "."):
            depth += 1
    return posixpath.normpath(path).replace("//", "/")

"""One sandbox as envd sees it: how to run a command inside it and signal that command."""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sandboxctl.envd.connect import ConnectError
from sandboxctl.envd.host import SANDBOX_HOME, RunningSandbox

HOME = SANDBOX_HOME
# How long a command may take to appear inside a (loaded) sandbox before the pid of the
# process spawned on the host is reported in place of its own.
ENTER_SECONDS = 5.0
ENTER_POLL_SECONDS = 0.001
_TASKS: set[asyncio.Task[None]] = set()


@dataclass(frozen=True, slots=True)
class Target:
    sandbox: RunningSandbox

    @property
    def id(self) -> str:
        return self.sandbox.id

    @property
    def env(self) -> Mapping[str, str]:
        """The sandbox's env vars from its claim."""
        return self.sandbox.env

    def log(self, message: str, level: str = "info", **fields: str) -> None:
        self.sandbox.log(message, level, **fields)

    async def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        stdin: bool = False,
        terminal: int | None = None,
    ) -> asyncio.subprocess.Process:
        """Start ``argv`` inside the sandbox, in a session of its own; with ``terminal``
        (a pty's follower fd) as its stdin, stdout and stderr."""
        command = await asyncio.to_thread(self.sandbox.enter_command, list(argv))
        pipe, devnull = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL
        return await asyncio.create_subprocess_exec(
            *command,
            stdin=terminal if terminal is not None else pipe if stdin else devnull,
            stdout=terminal if terminal is not None else pipe,
            stderr=terminal if terminal is not None else pipe,
            env=self.sandbox.process_env(env),
            start_new_session=True,
        )

    async def entered(self, process: asyncio.subprocess.Process) -> tuple[int, int]:
        """(host pid, pid inside the sandbox) of a command ``spawn`` started, once it is
        there: the pid ``ps`` and ``$$`` show in the sandbox. Until then a signal would
        find nothing to signal. A command that ends before it is seen, and a runtime
        without pid namespaces, give the pid of the process spawned on the host."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ENTER_SECONDS
        while process.returncode is None and loop.time() < deadline:
            found = self.sandbox.entered(process.pid)
            if found is not None:
                return found
            await asyncio.sleep(ENTER_POLL_SECONDS)
        return process.pid, process.pid

    async def run(
        self, argv: Sequence[str], stdin: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        """Run ``argv`` inside the sandbox to completion: (exit status, stdout, stderr)."""
        process = await self.spawn(argv, stdin=stdin is not None)
        try:
            out, err = await process.communicate(stdin)
        except BaseException:
            await self.kill(process)
            raise
        return process.returncode if process.returncode is not None else -1, out, err

    async def kill(self, process: asyncio.subprocess.Process, session: int | None = None) -> None:
        if process.returncode is None:
            await asyncio.to_thread(self.signal, process.pid, signal.SIGKILL, session)
            with contextlib.suppress(ProcessLookupError):
                process.kill()  # nsenter itself, once its child is gone or never started
            await process.wait()

    def kill_soon(self, process: asyncio.subprocess.Process, session: int | None = None) -> None:
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

"""A host process envd spawned (the runtime's entry into a sandbox), on the running event
loop, with what envd uses of ``asyncio.subprocess.Process``: its pid, streams, exit.

Why not asyncio's own: its child watcher waits for each child on a thread of its own and
hands the exit to the loop, and its subprocess transport closes its pipes through the
loop. A command may outlive the loop that started it (the agent stops its servers before
it destroys, or keeps, the sandboxes), and then both reach a closed loop: "Loop ... that
handles pid ... is closed", and "RuntimeError: Event loop is closed" from the transport's
finaliser. Here the exit is a pidfd the loop watches, so nothing is left to call into the
loop once it is gone, and :meth:`HostProcess.release` lets go of a process that still
runs (its pipes closed, no signal sent) while the loop still runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import IO, Any, Final

STREAM_LIMIT: Final = 1 << 16  # what asyncio's subprocess streams buffer at most


class HostProcess:
    """One spawned process: ``stdin`` a writer, ``stdout``/``stderr`` readers (None when
    they go to a terminal), its exit watched by a pidfd on the loop."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        stdin: asyncio.StreamWriter | None,
        stdout: asyncio.StreamReader | None,
        stderr: asyncio.StreamReader | None,
    ) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self._transports: list[asyncio.BaseTransport] = []
        self._loop = asyncio.get_running_loop()
        self._exit: asyncio.Future[int] = self._loop.create_future()
        self._pidfd: int | None = os.pidfd_open(popen.pid)
        self._loop.add_reader(self._pidfd, self._exited)

    @property
    def returncode(self) -> int | None:
        """The exit status once it has exited (a negative signal number if killed)."""
        return self._popen.returncode

    async def wait(self) -> int:
        if self._popen.returncode is not None:
            return self._popen.returncode
        return await asyncio.shield(self._exit)

    def kill(self) -> None:
        """SIGKILL, unless it has exited (and been reaped: its pid is not reused before)."""
        with contextlib.suppress(ProcessLookupError):
            self._popen.kill()

    async def communicate(self, data: bytes | None = None) -> tuple[bytes, bytes]:
        """Write ``data`` to its stdin and close it, read both outputs to their end, and
        wait for it to exit."""

        async def feed() -> None:
            if self.stdin is None:
                return
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                if data:
                    self.stdin.write(data)
                    await self.stdin.drain()
            self.stdin.close()

        async def drain(stream: asyncio.StreamReader | None) -> bytes:
            return await stream.read() if stream is not None else b""

        _, out, err = await asyncio.gather(feed(), drain(self.stdout), drain(self.stderr))
        await self.wait()
        return out, err

    def release(self) -> None:
        """Let go of it, whether or not it still runs: stop watching its exit and close
        its pipes (no signal is sent). For a process that outlives its server."""
        self._unwatch()
        for transport in self._transports:
            transport.close()

    def _exited(self) -> None:
        self._unwatch()
        status = self._popen.poll()  # reaps it: the pidfd says it has exited
        if status is None:  # cannot be, but never leave a waiter hanging
            status = self._popen.wait()
        if not self._exit.done():
            self._exit.set_result(status)

    def _unwatch(self) -> None:
        if self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None


async def spawn(
    argv: Sequence[str], env: Mapping[str, str], terminal: int | None = None
) -> HostProcess:
    """Start ``argv`` in a session of its own, its stdin a pipe; its stdout and stderr
    pipes too, or ``terminal`` (a pty's follower fd) for both."""
    loop = asyncio.get_running_loop()
    pipe = subprocess.PIPE
    popen = subprocess.Popen(
        list(argv),
        stdin=pipe,
        stdout=terminal if terminal is not None else pipe,
        stderr=terminal if terminal is not None else pipe,
        env=dict(env),
        start_new_session=True,
    )
    try:
        transports: list[asyncio.BaseTransport] = []
        stdin = await _writer(loop, popen.stdin, transports)
        stdout = await _reader(loop, popen.stdout, transports)
        stderr = await _reader(loop, popen.stderr, transports)
        process = HostProcess(popen, stdin, stdout, stderr)
    except BaseException:
        popen.kill()
        popen.wait()
        raise
    process._transports = transports
    return process


async def _reader(
    loop: asyncio.AbstractEventLoop, pipe: IO[bytes] | None, transports: list[Any]
) -> asyncio.StreamReader | None:
    if pipe is None:
        return None
    reader = asyncio.StreamReader(limit=STREAM_LIMIT, loop=loop)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    transports.append(transport)
    return reader


async def _writer(
    loop: asyncio.AbstractEventLoop, pipe: IO[bytes] | None, transports: list[Any]
) -> asyncio.StreamWriter | None:
    if pipe is None:
        return None
    # A reader's protocol gives the writer its flow control and its close waiter.
    protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=loop))
    transport, _ = await loop.connect_write_pipe(lambda: protocol, pipe)
    transports.append(transport)
    return asyncio.StreamWriter(transport, protocol, None, loop)

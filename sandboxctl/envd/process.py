"""The ``process.Process`` service: commands inside a sandbox, their output as events.

Each sandbox has a table of its running processes, keyed by each command's pid inside
the sandbox (what ``ps`` and ``$$`` show there). A process's output goes to every stream
attached to it (the ``Start`` that made it and any ``Connect``); output sent while no
stream listens is lost, as upstream. Output is read only as fast as the slowest of those
streams takes it (``outlet``): a client that does not read makes the command wait on its
writes, and never grows the agent.

The agent also keeps each command it starts (``RunningSandbox.remember``), so that after
it restarts and adopts a sandbox the commands its earlier process started are still
listed and can be signalled (killed); their input and output went with that process.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import contextlib
import fcntl
import logging
import os
import shlex
import signal as signals
import struct
import termios
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sandboxctl.envd.connect import ConnectError, end_of_stream, envelope
from sandboxctl.envd.connect import field as get
from sandboxctl.envd.host import Command, StartedCommand
from sandboxctl.envd.hostprocess import HostProcess
from sandboxctl.envd.outlet import Outlet
from sandboxctl.envd.target import HOME, Target, sandbox_path

log = logging.getLogger("sandboxctl.envd")

KEEPALIVE_SECONDS = 30.0
DEADLINE_SLACK = 0.5  # a stream cut this close to its deadline counts as timed out
# After the command exits, how long a silent pipe is still read (a child may hold it).
DRAIN_SECONDS = 1.0
READ_BYTES = 64 << 10
MAX_LOGGED_COMMAND = 200  # characters of a command line in the sandbox's log
SIGNALS = {
    "SIGNAL_SIGKILL": signals.SIGKILL,
    "SIGNAL_SIGTERM": signals.SIGTERM,
    9: signals.SIGKILL,
    15: signals.SIGTERM,
}
Event = dict[str, Any]
T = TypeVar("T")
DEFAULT_PTY_SIZE = (24, 80)  # rows, cols
# Terminals are the host's ptys, which every sandbox shares: at most this many each.
MAX_TERMINALS = 64


@dataclass(eq=False)
class Proc:
    pid: int  # inside the sandbox; ``process`` is what was spawned on the host
    config: dict[str, Any]
    tag: str | None
    process: HostProcess
    target: Target
    terminal: int | None = None  # the pty's controller fd: the command's input and output
    session: int | None = None  # with a pty: the command's host pid, its own session
    listeners: set[Outlet[Event]] = field(default_factory=set)
    end: Event | None = None

    def listen(self) -> Outlet[Event]:
        outlet: Outlet[Event] = Outlet()
        if self.end is not None:
            outlet.put_last(self.end)
        self.listeners.add(outlet)
        return outlet

    def unlisten(self, outlet: Outlet[Event]) -> None:
        self.listeners.discard(outlet)
        outlet.close()

    async def publish(self, event: Event) -> None:
        """Hand ``event`` to every stream, waiting for room in each."""
        for outlet in list(self.listeners):
            await outlet.put(event)

    def finish(self, end: Event) -> None:
        self.end = end
        for outlet in self.listeners:
            outlet.put_last(end)

    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"config": self.config, "pid": self.pid}
        if self.tag is not None:
            info["tag"] = self.tag
        return info


class ProcessService:
    def __init__(self) -> None:
        self._tables: dict[str, dict[int, Proc]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._terminals: collections.Counter[str] = collections.Counter()  # open, by sandbox

    def _table(self, target: Target) -> dict[int, Proc]:
        return self._tables.setdefault(target.id, {})

    # --- streams -----------------------------------------------------------------------

    async def start(
        self, target: Target, request: dict[str, Any], deadline: float | None
    ) -> AsyncIterator[bytes]:
        """Start the command now (errors before streaming become a plain error reply);
        the returned iterator yields the stream's envelopes."""
        config = get(request, "process") or {}
        if not isinstance(config, dict) or not config.get("cmd"):
            raise ConnectError("invalid_argument", "process.cmd is required")
        cmd = str(config["cmd"])
        args = [str(a) for a in config.get("args") or []]
        envs = {str(k): str(v) for k, v in (config.get("envs") or {}).items()}
        cwd = sandbox_path(config.get("cwd"), HOME)
        stdin = bool(get(request, "stdin", False))
        pty = get(request, "pty")
        size = _pty_size(pty) if pty is not None else None
        command = Command([cmd, *args], envs, cwd, "pipe" if stdin else "null")
        terminal = None
        if size is None:
            started = await target.start(command)
        else:
            if self._terminals[target.id] >= MAX_TERMINALS:
                raise ConnectError(
                    "resource_exhausted", f"a sandbox may have at most {MAX_TERMINALS} ptys open"
                )
            terminal, follower = os.openpty()
            self._terminals[target.id] += 1  # until the pump closes it
            try:
                _set_size(terminal, size)
                os.set_blocking(terminal, False)
                started = await target.start(command, terminal=follower)
            except BaseException:
                self._close_terminal(target.id, terminal)  # a command on it gets SIGHUP
                raise
            finally:
                os.close(follower)  # the command holds it: its exit ends the output
        process, host_pid, pid = started.process, started.host_pid, started.pid
        shown = {"cmd": cmd, "args": args, "envs": envs, "cwd": cwd}
        tag = get(request, "tag")
        proc = Proc(pid, shown, str(tag) if tag is not None else None, process, target)
        line = shlex.join([cmd, *args])
        if len(line) > MAX_LOGGED_COMMAND:
            line = line[:MAX_LOGGED_COMMAND] + "..."
        target.log(f"process {pid} started: {line}", pid=str(pid))
        if terminal is not None:
            proc.terminal, proc.session = terminal, host_pid
        queue = proc.listen()
        self._table(target)[proc.pid] = proc
        self._remember(proc, process.pid, host_pid)
        task = asyncio.get_running_loop().create_task(self._pump(proc))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return self._events(proc, queue, deadline, kill_on_deadline=True)

    async def connect(
        self, target: Target, request: dict[str, Any], deadline: float | None
    ) -> AsyncIterator[bytes]:
        proc = await self._own(target, get(request, "process"))
        return self._events(proc, proc.listen(), deadline, kill_on_deadline=False)

    async def _events(
        self,
        proc: Proc,
        queue: Outlet[Event],
        deadline: float | None,
        kill_on_deadline: bool,
    ) -> AsyncIterator[bytes]:
        try:
            yield envelope({"event": {"start": {"pid": proc.pid}}})
            while True:
                wait = KEEPALIVE_SECONDS
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        if kill_on_deadline:
                            await proc.target.kill(proc.process, proc.session)
                        yield end_of_stream(
                            ConnectError("deadline_exceeded", "the command timed out")
                        )
                        return
                try:
                    event = await asyncio.wait_for(queue.get(), wait)
                except TimeoutError:
                    if deadline is None or time.monotonic() < deadline:
                        yield envelope({"event": {"keepalive": {}}})
                    continue
                yield envelope({"event": event})
                if "end" in event:
                    yield end_of_stream()
                    return
        finally:
            proc.unlisten(queue)
            # the client may give up at its deadline a moment before we notice ours
            near = deadline is not None and time.monotonic() >= deadline - DEADLINE_SLACK
            if kill_on_deadline and near:
                proc.target.kill_soon(proc.process, proc.session)

    async def _pump(self, proc: Proc) -> None:
        """Publish the command's output, then its end; forget it once it has ended."""
        process = proc.process
        if proc.terminal is not None:
            fd = proc.terminal
            readers = [_Reader(lambda reader: self._read_terminal(proc, fd, reader))]
        else:
            readers = [
                _Reader(lambda reader: self._read(proc, process.stdout, "stdout", reader)),
                _Reader(lambda reader: self._read(proc, process.stderr, "stderr", reader)),
            ]
        ended = False  # a pump cancelled as the agent stops leaves its command running
        try:
            status = await process.wait()
            ended = True
            await _drain(readers)
            end: Event = {"exited": status >= 0, "status": _status(status)}
            if status != 0:
                end["exitCode"] = status if status >= 0 else -1
            proc.finish({"end": end})
            code = str(end.get("exitCode", 0))
            proc.target.log(
                f"process {proc.pid} exited with code {code} ({end['status']})",
                "info" if status == 0 else "warn",
                pid=str(proc.pid),
                exitCode=code,
            )
        except Exception:
            log.exception("process %d in %s", proc.pid, proc.target.id)
            proc.finish({"end": {"exitCode": -1, "status": "error", "error": "internal error"}})
        finally:
            for reader in readers:
                reader.task.cancel()
            if not ended:  # the server stops while it runs: let go, in this loop, unkilled
                process.release()
            if proc.terminal is not None:
                await asyncio.wait([r.task for r in readers])  # it stops watching the fd
                self._close_terminal(proc.target.id, proc.terminal)  # a job on it: SIGHUP
            table = self._tables.get(proc.target.id, {})
            if table.get(proc.pid) is proc:
                del table[proc.pid]
                if ended:  # else an adopting agent's next process lists it
                    proc.target.sandbox.forget(proc.pid)
            if not table:
                self._tables.pop(proc.target.id, None)

    def _close_terminal(self, sandbox_id: str, fd: int) -> None:
        os.close(fd)
        self._terminals[sandbox_id] -= 1
        if self._terminals[sandbox_id] <= 0:
            del self._terminals[sandbox_id]

    @staticmethod
    async def _read(
        proc: Proc, stream: asyncio.StreamReader | None, name: str, reader: _Reader
    ) -> None:
        if stream is None:
            return
        while chunk := await reader.waiting(stream.read(READ_BYTES)):
            await proc.publish({"data": {name: base64.b64encode(chunk).decode()}})

    @staticmethod
    async def _read_terminal(proc: Proc, fd: int, reader: _Reader) -> None:
        loop = asyncio.get_running_loop()
        readable = asyncio.Event()
        loop.add_reader(fd, readable.set)
        try:
            while True:
                await reader.waiting(readable.wait())
                readable.clear()
                try:
                    chunk = os.read(fd, READ_BYTES)
                except BlockingIOError:
                    continue
                except OSError:  # EIO: every process that had the pty open has closed it
                    return
                if not chunk:
                    return
                await proc.publish({"data": {"pty": base64.b64encode(chunk).decode()}})
        finally:
            loop.remove_reader(fd)

    # --- unary -------------------------------------------------------------------------

    async def list(self, target: Target) -> dict[str, Any]:
        """The commands running in the sandbox: this process's, and those an earlier
        agent process started that still run."""
        table = self._table(target).values()
        procs = [p for p in table if p.end is None and p.process.returncode is None]
        infos = [p.info() for p in procs]
        own = {p.pid for p in table}
        infos += [_info(adopted) for adopted in await self._remembered(target, own)]
        return {"processes": infos}

    async def send_signal(self, target: Target, request: dict[str, Any]) -> dict[str, Any]:
        name = get(request, "signal")
        found = await self._any(target, get(request, "process"))
        if name not in SIGNALS:
            raise ConnectError("invalid_argument", f"unsupported signal {name!r}")
        if isinstance(found, Proc):
            await asyncio.to_thread(target.signal, found.process.pid, SIGNALS[name], found.session)
        elif not await asyncio.to_thread(target.sandbox.signal_remembered, found, SIGNALS[name]):
            raise ConnectError("not_found", f"process with pid {found.pid} not found")
        return {}

    async def send_input(self, target: Target, request: dict[str, Any]) -> dict[str, Any]:
        proc = await self._own(target, get(request, "process"))
        data = get(request, "input") or {}
        name = "pty" if "pty" in data else "stdin"
        try:
            chunk = base64.b64decode(data.get(name) or "", validate=True)
        except (binascii.Error, TypeError):
            raise ConnectError("invalid_argument", f"input.{name} is not base64") from None
        if proc.terminal is not None:  # a command with a pty reads it, whatever the field
            await _write_terminal(proc.terminal, chunk)
            return {}
        if name == "pty":
            raise ConnectError("failed_precondition", "the process has no pty")
        stdin = self._stdin(proc)
        try:
            stdin.write(chunk)
            await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            raise ConnectError("failed_precondition", "the process closed its stdin") from None
        return {}

    async def stream_input(
        self, target: Target, messages: AsyncIterator[dict[str, Any]]
    ) -> dict[str, Any]:
        """``StreamInput``: a start event naming the process, then data events, each
        written to its stdin (or pty) as it arrives."""
        selector = None
        async for message in messages:
            if "start" in message:
                start = get(message, "start") or {}
                selector = {"pid": (await self._own(target, get(start, "process"))).pid}
            elif "data" in message:
                if selector is None:
                    raise ConnectError("invalid_argument", "the input stream must start with start")
                data = get(message, "data") or {}
                await self.send_input(target, {"process": selector, "input": get(data, "input")})
            elif "keepalive" not in message:
                raise ConnectError("invalid_argument", "expected a start, data or keepalive event")
        if selector is None:
            raise ConnectError("invalid_argument", "the input stream named no process")
        return {}

    async def update(self, target: Target, request: dict[str, Any]) -> dict[str, Any]:
        """Resize the process's pty (its foreground job gets SIGWINCH)."""
        proc = await self._own(target, get(request, "process"))
        pty = get(request, "pty")
        if pty is None:
            return {}
        if proc.terminal is None:
            raise ConnectError("failed_precondition", "the process has no pty")
        _set_size(proc.terminal, _pty_size(pty))
        return {}

    async def close_stdin(self, target: Target, request: dict[str, Any]) -> dict[str, Any]:
        proc = await self._own(target, get(request, "process"))
        if proc.terminal is not None:
            raise ConnectError(
                "failed_precondition", "a pty has no stdin to close: send Ctrl-D (\\x04)"
            )
        stdin = self._stdin(proc)
        stdin.close()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await stdin.wait_closed()
        return {}

    @staticmethod
    def _stdin(proc: Proc) -> asyncio.StreamWriter:
        stdin = proc.process.stdin
        if stdin is None:
            raise ConnectError("failed_precondition", "stdin was not enabled for this process")
        if stdin.is_closing():
            raise ConnectError("failed_precondition", "stdin is closed")
        return stdin

    def _remember(self, proc: Proc, leader: int, host_pid: int) -> None:
        """Keep the command where the agent's next process finds it; a failure to keep it
        costs only that (the command runs)."""
        kept = StartedCommand(proc.pid, leader, host_pid, proc.session, proc.config, proc.tag)
        try:
            proc.target.sandbox.remember(kept)
        except Exception:
            log.exception("could not keep process %d of %s", proc.pid, proc.target.id)

    async def _remembered(self, target: Target, own: set[int]) -> Sequence[StartedCommand]:
        """What an earlier agent process started in this sandbox that still runs."""
        return await asyncio.to_thread(target.sandbox.remembered, own)

    async def _any(self, target: Target, selector: Any) -> Proc | StartedCommand:
        """The process ``selector`` names: this process's, else one an earlier agent
        process started that still runs."""
        try:
            return self._select(target, selector)
        except ConnectError as missing:
            if missing.code != "not_found":
                raise
            own = set(self._table(target))
            for adopted in await self._remembered(target, own):
                if _selects(selector, adopted):
                    return adopted
            raise

    async def _own(self, target: Target, selector: Any) -> Proc:
        """The process ``selector`` names, which this agent process started: one an
        earlier process started can be listed and signalled only."""
        found = await self._any(target, selector)
        if isinstance(found, StartedCommand):
            raise ConnectError(
                "failed_precondition",
                f"process {found.pid} was started before the agent restarted: it can be "
                "listed and signalled, but its input and output are no longer reachable",
            )
        return found

    def _select(self, target: Target, selector: Any) -> Proc:
        if not isinstance(selector, dict):
            raise ConnectError("invalid_argument", "process selector is required")
        table = self._table(target)
        if "pid" in selector:
            try:
                pid = int(selector["pid"])
            except (TypeError, ValueError):
                raise ConnectError("invalid_argument", "pid is not an integer") from None
            proc = table.get(pid)
            if proc is None or proc.end is not None:
                raise ConnectError("not_found", f"process with pid {pid} not found")
            return proc
        if "tag" in selector:
            for proc in table.values():
                if proc.tag == selector["tag"] and proc.end is None:
                    return proc
            raise ConnectError("not_found", f"process with tag {selector['tag']} not found")
        raise ConnectError("invalid_argument", "process selector needs a pid or a tag")

    async def close(self) -> None:
        """Kill every command still running (the agent is shutting down)."""
        for table in list(self._tables.values()):
            for proc in list(table.values()):
                with contextlib.suppress(Exception):
                    await proc.target.kill(proc.process, proc.session)


class _Reader:
    """A task reading one of a command's outputs, and since when it has waited on the
    command (``None`` while it waits for a stream to take what it read)."""

    def __init__(self, read: Callable[[_Reader], Coroutine[Any, Any, None]]) -> None:
        self.idle_since: float | None = None
        self.task = asyncio.get_running_loop().create_task(read(self))

    async def waiting(self, read: Awaitable[T]) -> T:
        self.idle_since = time.monotonic()
        try:
            return await read
        finally:
            self.idle_since = None


async def _drain(readers: list[_Reader]) -> None:
    """Once the command has exited: wait for its outputs to end, for as long as streams
    are still taking what was read, but let go of a pipe that stays silent for
    DRAIN_SECONDS (a child of the command still holds it)."""
    exited = time.monotonic()
    # A poll of the readers' state, and only while a command's pipes outlive it.
    while pending := [r for r in readers if not r.task.done()]:
        await asyncio.wait([r.task for r in pending], timeout=DRAIN_SECONDS / 4)
        now = time.monotonic()
        for reader in pending:
            idle = reader.idle_since
            if idle is not None and now - max(idle, exited) >= DRAIN_SECONDS:
                reader.task.cancel()


def _info(command: StartedCommand) -> dict[str, Any]:
    """A remembered command as ``List`` shows it (as :meth:`Proc.info`)."""
    info: dict[str, Any] = {"config": dict(command.config), "pid": command.pid}
    if command.tag is not None:
        info["tag"] = command.tag
    return info


def _selects(selector: dict[str, Any], command: StartedCommand) -> bool:
    """Whether a selector that :meth:`ProcessService._select` took names ``command``."""
    if "pid" in selector:
        return int(selector["pid"]) == command.pid
    return command.tag is not None and selector.get("tag") == command.tag


def _pty_size(pty: Any) -> tuple[int, int]:
    """(rows, cols) of a ``PTY`` message; a missing size or side is 24x80's."""
    size = get(pty, "size") if isinstance(pty, dict) else None
    if size is None:
        return DEFAULT_PTY_SIZE
    if not isinstance(size, dict):
        raise ConnectError("invalid_argument", "pty.size must be an object")
    sides = []
    for name, default in zip(("rows", "cols"), DEFAULT_PTY_SIZE, strict=True):
        value = size.get(name, default)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 0xFFFF:
            raise ConnectError("invalid_argument", f"pty.size.{name}: expected 1..65535")
        sides.append(value)
    return sides[0], sides[1]


def _set_size(fd: int, size: tuple[int, int]) -> None:
    rows, cols = size
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


async def _write_terminal(fd: int, data: bytes) -> None:
    loop = asyncio.get_running_loop()
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:  # the pty's input buffer is full: wait until it drains
            writable = loop.create_future()
            loop.add_writer(fd, writable.set_result, None)
            try:
                await writable
            finally:
                loop.remove_writer(fd)
            continue
        except OSError:
            raise ConnectError("failed_precondition", "the pty is closed") from None
        view = view[written:]


def _status(status: int) -> str:
    if status >= 0:
        return f"exit status {status}"
    try:
        name = signals.Signals(-status).name
    except ValueError:
        name = f"signal {-status}"
    return {"SIGKILL": "signal: killed", "SIGTERM": "signal: terminated"}.get(name, name)

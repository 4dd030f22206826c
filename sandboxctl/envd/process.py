"""The ``process.Process`` service: commands inside a sandbox, their output as events.

Each sandbox has a table of its running processes, keyed by each command's pid inside
the sandbox (what ``ps`` and ``$$`` show there). A process's output goes to every stream
attached to it (the ``Start`` that made it and any ``Connect``); output sent while no
stream listens is lost, as upstream.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import signal as signals
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from sandboxctl.envd.connect import ConnectError, end_of_stream, envelope
from sandboxctl.envd.connect import field as get
from sandboxctl.envd.target import HOME, Target, sandbox_path

log = logging.getLogger("sandboxctl.envd")

KEEPALIVE_SECONDS = 30.0
DEADLINE_SLACK = 0.5  # a stream cut this close to its deadline counts as timed out
DRAIN_SECONDS = 1.0  # after the command exits, how long its output may still arrive
READ_BYTES = 64 << 10
SIGNALS = {
    "SIGNAL_SIGKILL": signals.SIGKILL,
    "SIGNAL_SIGTERM": signals.SIGTERM,
    9: signals.SIGKILL,
    15: signals.SIGTERM,
}
Event = dict[str, Any]


@dataclass(eq=False)
class Proc:
    pid: int  # inside the sandbox; ``process`` is what was spawned on the host
    config: dict[str, Any]
    tag: str | None
    process: asyncio.subprocess.Process
    target: Target
    listeners: set[asyncio.Queue[Event]] = field(default_factory=set)
    end: Event | None = None

    def listen(self) -> asyncio.Queue[Event]:
        queue: asyncio.Queue[Event] = asyncio.Queue()
        if self.end is not None:
            queue.put_nowait(self.end)
        self.listeners.add(queue)
        return queue

    def publish(self, event: Event) -> None:
        for queue in self.listeners:
            queue.put_nowait(event)

    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"config": self.config, "pid": self.pid}
        if self.tag is not None:
            info["tag"] = self.tag
        return info


class ProcessService:
    def __init__(self) -> None:
        self._tables: dict[str, dict[int, Proc]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

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
        if get(request, "pty") is not None:
            raise ConnectError("unimplemented", "pty is not supported")
        cmd = str(config["cmd"])
        args = [str(a) for a in config.get("args") or []]
        envs = {str(k): str(v) for k, v in (config.get("envs") or {}).items()}
        cwd = sandbox_path(config.get("cwd"), HOME)
        stdin = bool(get(request, "stdin", False))
        # cd inside the sandbox, so a missing cwd is the command's own error
        argv = ["/bin/sh", "-c", 'cd -- "$1" && shift && exec "$@"', "sh", cwd, cmd, *args]
        # The sandbox's env from its claim, under the request's own (as upstream envd)
        process = await target.spawn(argv, env={**target.env, **envs}, stdin=stdin)
        shown = {"cmd": cmd, "args": args, "envs": envs, "cwd": cwd}
        tag = get(request, "tag")
        pid = await target.entered(process)
        proc = Proc(pid, shown, str(tag) if tag is not None else None, process, target)
        queue = proc.listen()
        self._table(target)[proc.pid] = proc
        task = asyncio.get_running_loop().create_task(self._pump(proc))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return self._events(proc, queue, deadline, kill_on_deadline=True)

    async def connect(
        self, target: Target, request: dict[str, Any], deadline: float | None
    ) -> AsyncIterator[bytes]:
        proc = self._select(target, get(request, "process"))
        return self._events(proc, proc.listen(), deadline, kill_on_deadline=False)

    async def _events(
        self,
        proc: Proc,
        queue: asyncio.Queue[Event],
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
                            await proc.target.kill(proc.process)
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
            proc.listeners.discard(queue)
            # the client may give up at its deadline a moment before we notice ours
            near = deadline is not None and time.monotonic() >= deadline - DEADLINE_SLACK
            if kill_on_deadline and near:
                proc.target.kill_soon(proc.process)

    async def _pump(self, proc: Proc) -> None:
        """Publish the command's output, then its end; forget it once it has ended."""
        process = proc.process
        readers = [
            asyncio.create_task(self._read(proc, process.stdout, "stdout")),
            asyncio.create_task(self._read(proc, process.stderr, "stderr")),
        ]
        try:
            status = await process.wait()
            # a child that kept the pipes open must not hold the end event back forever
            _, pending = await asyncio.wait(readers, timeout=DRAIN_SECONDS)
            for task in pending:
                task.cancel()
            end: Event = {"exited": status >= 0, "status": _status(status)}
            if status != 0:
                end["exitCode"] = status if status >= 0 else -1
            proc.end = {"end": end}
            proc.publish(proc.end)
        except Exception:
            log.exception("process %d in %s", proc.pid, proc.target.id)
            proc.end = {"end": {"exitCode": -1, "status": "error", "error": "internal error"}}
            proc.publish(proc.end)
        finally:
            table = self._tables.get(proc.target.id, {})
            if table.get(proc.pid) is proc:
                del table[proc.pid]
            if not table:
                self._tables.pop(proc.target.id, None)

    @staticmethod
    async def _read(proc: Proc, stream: asyncio.StreamReader | None, name: str) -> None:
        if stream is None:
            return
        while chunk := await stream.read(READ_BYTES):
            proc.publish({"data": {name: base64.b64encode(chunk).decode()}})

    # --- unary -------------------------------------------------------------------------

    def list(self, target: Target) -> dict[str, Any]:
        table = self._table(target).values()
        procs = [p for p in table if p.end is None and p.process.returncode is None]
        return {"processes": [p.info() for p in procs]}

    async def send_signal(self, target: Target, request: dict[str, Any]) -> dict[str, Any]:
        proc = self._select(target, get(request, "process"))
        name = get(request, "signal")
        if name not in SIGNALS:
            raise ConnectError("invalid_argument", f"unsupported signal {name!r}")
        await asyncio.to_thread(target.signal, proc.process.pid, SIGNALS[name])
        return {}

    async def send_input(self, target: Target, request: dict[str, Any]) -> dict[str, Any]:
        proc = self._select(target, get(request, "process"))
        data = get(request, "input") or {}
        if "pty" in data:
            raise ConnectError("unimplemented", "pty is not supported")
        try:
            chunk = base64.b64decode(data.get("stdin") or "", validate=True)
        except (binascii.Error, TypeError):
            raise ConnectError("invalid_argument", "input.stdin is not base64") from None
        stdin = self._stdin(proc)
        try:
            stdin.write(chunk)
            await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            raise ConnectError("failed_precondition", "the process closed its stdin") from None
        return {}

    async def close_stdin(self, target: Target, request: dict[str, Any]) -> dict[str, Any]:
        proc = self._select(target, get(request, "process"))
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
                    await proc.target.kill(proc.process)


def _status(status: int) -> str:
    if status >= 0:
        return f"exit status {status}"
    try:
        name = signals.Signals(-status).name
    except ValueError:
        name = f"signal {-status}"
    return {"SIGKILL": "signal: killed", "SIGTERM": "signal: terminated"}.get(name, name)

"""Directory watchers: an inotify helper runs *inside* the sandbox (python3, ctypes) and
prints one JSON line per event; ``CreateWatcher``/``GetWatcherEvents``/``RemoveWatcher``
poll those events, ``WatchDir`` streams them."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from sandboxctl.envd.connect import ConnectError, end_of_stream, envelope
from sandboxctl.envd.connect import field as get
from sandboxctl.envd.host import Command
from sandboxctl.envd.hostprocess import HostProcess
from sandboxctl.envd.outlet import Outlet
from sandboxctl.envd.target import Target, sandbox_path

KEEPALIVE_SECONDS = 30.0
MAX_PENDING_EVENTS = 10_000

HELPER = r"""
import ctypes, json, os, struct, sys
root, recursive = sys.argv[1], sys.argv[2] == "1"
libc = ctypes.CDLL(None, use_errno=True)
MASK = 0x2 | 0x4 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400
fd = libc.inotify_init1(0)
watches = {}
def say(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()
def add(path):
    wd = libc.inotify_add_watch(fd, path.encode(), MASK)
    if wd >= 0:
        watches[wd] = path
    return wd
if not os.path.isdir(root):
    code = "invalid_argument" if os.path.exists(root) else "not_found"
    say({"error": [code, "not a directory: " + root]})
    sys.exit(0)
if add(root) < 0:
    say({"error": ["permission_denied", os.strerror(ctypes.get_errno()) + ": " + root]})
    sys.exit(0)
if recursive:
    for base, dirs, _ in os.walk(root):
        for d in dirs:
            add(os.path.join(base, d))
say({"ready": True})
KINDS = ((0x100, "CREATE"), (0x80, "CREATE"), (0x2, "WRITE"), (0x200, "REMOVE"),
         (0x400, "REMOVE"), (0x40, "RENAME"), (0x4, "CHMOD"))
while True:
    data = os.read(fd, 65536)
    offset = 0
    while offset < len(data):
        wd, mask, _, size = struct.unpack_from("iIII", data, offset)
        name = data[offset + 16 : offset + 16 + size].rstrip(b"\0").decode(errors="replace")
        offset += 16 + size
        base = watches.get(wd)
        if base is None:
            continue
        path = os.path.join(base, name) if name else base
        if recursive and mask & 0x40000000 and mask & (0x100 | 0x80):
            add(path)
        if mask & 0x400 and path == root:
            say({"name": "", "type": "EVENT_TYPE_REMOVE"})
            sys.exit(0)
        if mask & 0x400:
            continue
        for bit, kind in KINDS:
            if mask & bit:
                say({"name": os.path.relpath(path, root), "type": "EVENT_TYPE_" + kind})
                break
"""


@dataclass(eq=False)
class Watcher:
    id: str
    target: Target
    process: HostProcess
    events: list[dict[str, Any]] = field(default_factory=list)
    listeners: set[Outlet[dict[str, Any] | None]] = field(default_factory=set)
    reader: asyncio.Task[None] | None = None
    done: bool = False

    async def read(self) -> None:
        assert self.process.stdout is not None
        try:
            while line := await self.process.stdout.readline():
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if len(self.events) < MAX_PENDING_EVENTS:
                    self.events.append(event)
                for outlet in list(self.listeners):
                    await outlet.put(event)  # a stream that does not read holds the helper
        finally:
            self.done = True
            for outlet in self.listeners:
                outlet.put_last(None)


class WatchService:
    def __init__(self) -> None:
        self._watchers: dict[str, dict[str, Watcher]] = {}

    async def _open(self, target: Target, request: dict[str, Any]) -> Watcher:
        path = sandbox_path(get(request, "path"))
        recursive = "1" if get(request, "recursive", False) else "0"
        argv = ["python3", "-I", "-S", "-u", "-c", HELPER, path, recursive]
        process = await target.spawn(Command(argv))
        assert process.stdout is not None
        first = await process.stdout.readline()
        try:
            ready = json.loads(first)
        except ValueError:
            ready = {"error": ["internal", "the watcher did not start"]}
        if "error" in ready:
            await target.kill(process)
            code, message = ready["error"]
            raise ConnectError(code, message)
        watcher = Watcher(secrets.token_hex(8), target, process)
        watcher.reader = asyncio.get_running_loop().create_task(watcher.read())
        return watcher

    async def create(self, target: Target, request: dict[str, Any]) -> dict[str, Any]:
        watcher = await self._open(target, request)
        self._watchers.setdefault(target.id, {})[watcher.id] = watcher
        return {"watcherId": watcher.id}

    def events(self, target: Target, request: dict[str, Any]) -> dict[str, Any]:
        watcher = self._find(target, request)
        events, watcher.events = watcher.events, []
        return {"events": events}

    async def remove(self, target: Target, request: dict[str, Any]) -> dict[str, Any]:
        watcher = self._find(target, request)
        del self._watchers[target.id][watcher.id]
        await target.kill(watcher.process)
        return {}

    def _find(self, target: Target, request: dict[str, Any]) -> Watcher:
        watcher_id = str(get(request, "watcherId", ""))
        watcher = self._watchers.get(target.id, {}).get(watcher_id)
        if watcher is None:
            raise ConnectError("not_found", f"watcher {watcher_id!r} not found")
        return watcher

    async def watch_dir(
        self, target: Target, request: dict[str, Any], deadline: float | None
    ) -> AsyncIterator[bytes]:
        watcher = await self._open(target, request)
        outlet: Outlet[dict[str, Any] | None] = Outlet()
        watcher.listeners.add(outlet)
        return self._stream(watcher, outlet, deadline)

    @staticmethod
    async def _stream(
        watcher: Watcher, outlet: Outlet[dict[str, Any] | None], deadline: float | None
    ) -> AsyncIterator[bytes]:
        try:
            yield envelope({"start": {}})
            while True:
                wait = KEEPALIVE_SECONDS
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        yield end_of_stream(ConnectError("deadline_exceeded", "deadline exceeded"))
                        return
                try:
                    event = await asyncio.wait_for(outlet.get(), wait)
                except TimeoutError:
                    yield envelope({"keepalive": {}})
                    continue
                if event is None:
                    yield end_of_stream()
                    return
                yield envelope({"filesystem": event})
        finally:
            watcher.listeners.discard(outlet)
            outlet.close()
            watcher.target.kill_soon(watcher.process)

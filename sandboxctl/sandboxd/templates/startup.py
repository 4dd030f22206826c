"""A template's start and ready commands, as e2b runs them: the start command runs in the
background in every new sandbox of the template (a server, say) for the sandbox's life,
and the sandbox counts as started (warm, or handed to a cold claim) only once the ready
command exits 0. Both run inside the sandbox as its user, through the runtime's ``enter``.

The sandbox's log (``events``) says when the start command started, when the sandbox was
ready, and when the start command ended and how.
"""

from __future__ import annotations

import collections
import subprocess
import threading
import time
from collections.abc import Callable

from sandboxctl.core.templates import READY_TIMEOUT
from sandboxctl.envd.host import Command, Entry
from sandboxctl.sandboxd import entering
from sandboxctl.sandboxd.events import EventLog
from sandboxctl.sandboxd.runtime import Identity, Runtime, RuntimeFailure, SandboxSpec
from sandboxctl.sandboxd.templates.catalog import Served

READY_INTERVAL = 0.2
OUTPUT_TAIL = 20  # lines
LINE_CHARACTERS = 4096


def start_template(
    runtime: Runtime,
    spec: SandboxSpec,
    identity: Identity,
    template: Served,
    events: EventLog,
    timeout: float = READY_TIMEOUT,
) -> None:
    """Start ``template``'s start command in the sandbox and wait for its ready command;
    RuntimeFailure (the caller destroys the sandbox) when the start command fails first
    or the ready command does not exit 0 within ``timeout``."""
    started = time.monotonic()
    start = None
    if template.start_cmd:
        entry = runtime.enter(spec, identity, _shell(template.start_cmd))
        start = _Background(entry, lambda code, said: _ended(events, spec.id, code, said))
        events.record(spec.id, f"start command started: {template.start_cmd}")
    if not template.ready_cmd:
        return
    deadline = started + timeout
    last = ""
    while True:
        if start is not None and start.code not in (None, 0):
            raise RuntimeFailure(
                f"template {template.name}: the start command exited with code {start.code} "
                f"before the sandbox was ready" + _said(start.output())
            )
        ready = entering.run(
            runtime.enter(spec, identity, _shell(template.ready_cmd, inline=True)),
            text=True,
            errors="replace",
        )
        if ready.returncode == 0:
            events.record(
                spec.id,
                f"sandbox ready after {time.monotonic() - started:.1f}s: ready command exited 0",
            )
            return
        last = f"exit {ready.returncode}" + _said((ready.stdout + ready.stderr).splitlines())
        if time.monotonic() >= deadline:
            raise RuntimeFailure(
                f"template {template.name}: the ready command {template.ready_cmd!r} did not "
                f"succeed within {timeout:g}s (last: {last})"
            )
        time.sleep(READY_INTERVAL)


class _Background:
    """A command that runs in the sandbox until it ends (``code`` is then its exit
    status), its output's tail kept; ``ended`` is told its status and last line."""

    def __init__(self, entry: Entry, ended: Callable[[int, str], None]) -> None:
        self._tail: collections.deque[str] = collections.deque(maxlen=OUTPUT_TAIL)
        self.code: int | None = None
        self._ended = ended
        self._process = entering.popen(
            entry, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
        threading.Thread(target=self._wait, name="template start command", daemon=True).start()

    def output(self) -> list[str]:
        return list(self._tail)

    def _wait(self) -> None:
        assert self._process.stdout is not None
        stdout = self._process.stdout
        with stdout:
            # At most LINE_CHARACTERS a line: a line that never ends cannot grow the agent.
            for line in iter(lambda: stdout.readline(LINE_CHARACTERS), ""):
                self._tail.append(line.rstrip("\n"))
        self.code = self._process.wait()
        self._ended(self.code, _said(self.output()))


def _ended(events: EventLog, sandbox_id: str, code: int, said: str) -> None:
    ended = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    events.record(
        sandbox_id,
        f"start command {ended}{said}",
        level="warn" if code else "info",
        exitCode=str(code),
    )


def _shell(command: str, inline: bool = False) -> Command:
    """``command`` by /bin/sh; ``inline``: by the shell that enters the sandbox, one
    program less for a ready command run every READY_INTERVAL (a start command gets a
    shell of its own, which execs a lone server as ``sh -c`` does)."""
    return Command(["/bin/sh", "-c", command], inline_shell=inline)


def _said(lines: list[str]) -> str:
    last = next((line.strip() for line in reversed(lines) if line.strip()), "")
    return f": {last}" if last else ""

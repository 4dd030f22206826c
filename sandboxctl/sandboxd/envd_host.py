"""The agent as envd sees it: :class:`sandboxctl.envd.host.Sandboxes` over the agent's
records and runtime, so envd needs nothing from this package.

The commands envd starts are also kept on disk (:class:`CommandBook`, in the agent's own
state dir, which no sandbox can reach), so that an agent that restarts and adopts a
sandbox still lists and kills the commands its earlier process started. Nothing read
back is trusted as it stands: a remembered command counts only while its host pid is
still the very process that was started (its start time), in this sandbox's pid
namespace, with this sandbox's uid, and a signal goes only to such processes, each
pinned by a pidfd before it is checked, so neither a stale entry nor a recycled pid can
reach another sandbox's process or the host's."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from sandboxctl.envd.host import (
    Command,
    Entry,
    RunningSandbox,
    SandboxUnavailable,
    StartedCommand,
)
from sandboxctl.sandboxd import procfs
from sandboxctl.sandboxd.agent import Agent
from sandboxctl.sandboxd.errors import NoSuchSandbox
from sandboxctl.sandboxd.events import EventLog
from sandboxctl.sandboxd.runtime import Identity, Runtime, RuntimeFailure, SandboxSpec

log = logging.getLogger("sandboxctl.sandboxd")

COMMANDS_DIR: Final = "envd-commands"  # in the agent's state dir: DIR/SANDBOX_ID/PID.json
_SANDBOX_ID: Final = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_ENTRY: Final = re.compile(r"^([0-9]{1,10})\.json$")


@dataclass(frozen=True, slots=True)
class AgentSandboxes:
    agent: Agent

    def running(self, sandbox_id: str) -> RunningSandbox:
        try:
            record = self.agent.get(sandbox_id)
        except NoSuchSandbox:
            raise SandboxUnavailable(sandbox_id) from None
        if record.hibernated:
            raise SandboxUnavailable(sandbox_id, paused=True)
        return RuntimeSandbox(
            self.agent.spec(record),
            self.agent.identity(record),
            self.agent.runtime,
            self.agent.events,
            CommandBook(self.agent.settings.state_dir / COMMANDS_DIR, self._holds),
        )

    def _holds(self, sandbox_id: str) -> bool:
        try:
            self.agent.get(sandbox_id)
        except NoSuchSandbox:
            return False
        return True


@dataclass(frozen=True, slots=True)
class CommandBook:
    """The commands envd started, one small file each (``DIR/SANDBOX_ID/PID.json``,
    root's, 0600), written when a command starts and removed when it ends. Not synced:
    an agent's restart keeps the page cache, and a host's reboot ends every command."""

    directory: Path
    holds: Callable[[str], bool]  # whether the agent still has this sandbox

    def write(self, sandbox_id: str, pid: int, body: Mapping[str, Any]) -> None:
        folder = self._folder(sandbox_id)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        scratch = folder / f".{pid}.json"
        descriptor = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
            json.dump(body, stream)
        os.replace(scratch, folder / f"{pid}.json")

    def remove(self, sandbox_id: str, pid: int) -> None:
        (self._folder(sandbox_id) / f"{pid}.json").unlink(missing_ok=True)

    def read(self, sandbox_id: str, skip: Collection[int]) -> list[tuple[int, Any]]:
        """(pid, body) of each entry of ``sandbox_id`` but ``skip``'s; an unreadable one
        is removed."""
        found = []
        try:
            names = os.listdir(self._folder(sandbox_id))
        except FileNotFoundError:
            return []
        for name in names:
            match = _ENTRY.match(name)
            if match is None or int(match[1]) in skip:
                continue
            pid = int(match[1])
            try:
                found.append((pid, json.loads((self._folder(sandbox_id) / name).read_text())))
            except FileNotFoundError:
                continue  # it ended meanwhile
            except (OSError, ValueError):
                self.remove(sandbox_id, pid)
        return found

    def prune(self) -> None:
        """Drop the entries of every sandbox the agent no longer has: their commands
        ended with them (an agent that stopped while they ran never removed theirs)."""
        try:
            folders = os.listdir(self.directory)
        except FileNotFoundError:
            return
        for name in folders:
            if _SANDBOX_ID.match(name) and not self.holds(name):
                shutil.rmtree(self.directory / name, ignore_errors=True)

    def _folder(self, sandbox_id: str) -> Path:
        if not _SANDBOX_ID.match(sandbox_id):  # the agent's own ids; never a path
            raise ValueError(f"not a sandbox id: {sandbox_id!r}")
        return self.directory / sandbox_id


@dataclass(frozen=True, slots=True)
class RuntimeSandbox:
    """One claimed sandbox through the runtime that runs it."""

    spec: SandboxSpec
    identity: Identity
    runtime: Runtime
    events: EventLog
    book: CommandBook

    @property
    def id(self) -> str:
        return self.spec.id

    def log(self, message: str, level: str = "info", **fields: str) -> None:
        self.events.record(self.spec.id, message, level, **fields)

    @property
    def env(self) -> Mapping[str, str]:
        return self.spec.env

    def enter(self, command: Command) -> Entry:
        # The claim's variables under the command's own, as upstream envd sets them.
        command = replace(command, env={**self.spec.env, **command.env})
        try:
            return self.runtime.enter(self.spec, self.identity, command)
        except RuntimeFailure:  # its init is gone: dead, and not yet cleaned up
            raise SandboxUnavailable(self.spec.id) from None

    def entered(self, leader: int) -> tuple[int, int] | None:
        # Only runtimes with a pid namespace can tell; in the others the leader is the
        # command.
        entered = getattr(self.runtime, "entered", None)
        if entered is None:
            return leader, leader
        found: tuple[int, int] | None = entered(self.identity, leader)
        return found

    def signal_command(self, pgid: int, sig: int) -> None:
        signal_entered = getattr(self.runtime, "signal_entered", None)
        if signal_entered is not None:
            signal_entered(pgid, sig)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)

    def remember(self, command: StartedCommand) -> None:
        stat = procfs.read_stat(command.host_pid)
        if stat is None:
            return  # it has ended already
        body = {
            "pid": command.pid,
            "leader": command.leader,
            "host_pid": command.host_pid,
            "start_time": stat.start_time,  # who host_pid is: never a recycled pid
            "session": command.session,
            "config": dict(command.config),
            "tag": command.tag,
        }
        try:
            self.book.write(self.spec.id, command.pid, body)
        except OSError as error:  # the command runs; only a restart would not list it
            log.warning("could not keep command %d of %s: %s", command.pid, self.spec.id, error)

    def forget(self, pid: int) -> None:
        with contextlib.suppress(OSError):
            self.book.remove(self.spec.id, pid)

    def remembered(self, skip: Collection[int] = ()) -> list[StartedCommand]:
        found = []
        for pid, body in self.book.read(self.spec.id, skip):
            checked = self._running(pid, body)
            if checked is None:
                self.forget(pid)  # ended: while no agent watched, or just now
            else:
                found.append(checked[0])
        self.book.prune()
        return sorted(found, key=lambda command: command.pid)

    def signal_remembered(self, command: StartedCommand, sig: int) -> bool:
        entries = dict(self.book.read(self.spec.id, ()))
        if command.pid not in entries or self._running(command.pid, entries[command.pid]) is None:
            return False
        groups = {command.leader} | ({command.session} if command.session else set())
        for pid in procfs.all_pids():
            stat = procfs.read_stat(pid)
            if stat is not None and stat.pgrp in groups:
                self._signal_own(pid, groups, signal.Signals(sig))
        return True

    def _running(self, pid: int, body: Any) -> tuple[StartedCommand, int] | None:
        """The command an entry names and its start time, while its host pid is still
        that very process, in this sandbox, with its uid; else None."""
        try:
            host_pid, start_time = int(body["host_pid"]), int(body["start_time"])
            session = int(body["session"]) if body.get("session") is not None else None
            tag = body.get("tag")
            command = StartedCommand(
                pid=pid,
                leader=int(body["leader"]),
                host_pid=host_pid,
                session=session,
                config=dict(body["config"]),
                tag=str(tag) if tag is not None else None,
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        alive = Identity(host_pid, start_time, self.identity.pid_namespace)
        if not procfs.matches(alive) or procfs.innermost_pid(host_pid) != pid:
            return None
        if _uid_of(host_pid) != self.spec.uid:
            return None
        return command, start_time

    def _signal_own(self, pid: int, groups: set[int], sig: signal.Signals) -> None:
        """Signal ``pid`` if, pinned by a pidfd, it is still in one of ``groups``, in this
        sandbox's pid namespace, with its uid: never the host's nsenter (root, outside)
        nor a process of another sandbox."""
        try:
            pidfd = os.pidfd_open(pid)
        except (ProcessLookupError, OSError):
            return
        try:
            stat = procfs.read_stat(pid)
            if stat is None or stat.pgrp not in groups or stat.state in ("Z", "X"):
                return
            if procfs.pid_namespace(pid) != self.identity.pid_namespace:
                return
            if _uid_of(pid) != self.spec.uid:
                return
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, sig)
        finally:
            os.close(pidfd)


def _uid_of(pid: int) -> int | None:
    """The real uid of ``pid``, or None when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    for line in status.splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return None

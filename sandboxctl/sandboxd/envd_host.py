"""The agent as envd sees it: :class:`sandboxctl.envd.host.Sandboxes` over the agent's
records and runtime, so envd needs nothing from this package.

The commands envd starts are also kept on disk (``commandbook.CommandBook``), so that an
agent that restarts and adopts a sandbox still lists and kills the commands its earlier
process started. :class:`RuntimeSandbox` applies the book's trust rule: a remembered
command counts only while its host pid is still the very process that was started (its
start time), in this sandbox's pid namespace, with this sandbox's uid, and a signal goes
only to such processes, each pinned by a pidfd before it is checked."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from sandboxctl.envd.host import (
    Command,
    Entry,
    RunningSandbox,
    SandboxUnavailable,
    StartedCommand,
)
from sandboxctl.sandboxd import procfs
from sandboxctl.sandboxd.agent import Agent
from sandboxctl.sandboxd.commandbook import COMMANDS_DIR, CommandBook
from sandboxctl.sandboxd.errors import NoSuchSandbox
from sandboxctl.sandboxd.events import EventLog
from sandboxctl.sandboxd.runtime import Identity, Runtime, RuntimeFailure, SandboxSpec

log = logging.getLogger("sandboxctl.sandboxd")


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
                procfs.signal_pinned(pid, lambda p: self._owns(p, groups), sig)
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
        if procfs.uid_of(host_pid) != self.spec.uid:
            return None
        return command, start_time

    def _owns(self, pid: int, groups: set[int]) -> bool:
        """Whether ``pid`` is in one of ``groups``, alive, in this sandbox's pid namespace,
        with its uid: never the host's nsenter (root, outside) nor a process of another
        sandbox."""
        stat = procfs.read_stat(pid)
        if stat is None or stat.pgrp not in groups or stat.state in ("Z", "X"):
            return False
        if procfs.pid_namespace(pid) != self.identity.pid_namespace:
            return False
        return procfs.uid_of(pid) == self.spec.uid

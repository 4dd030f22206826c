"""The agent as envd sees it: :class:`sandboxctl.envd.host.Sandboxes` over the agent's
records and runtime, so envd needs nothing from this package."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

from sandboxctl.envd.host import Command, Entry, RunningSandbox, SandboxUnavailable
from sandboxctl.sandboxd.agent import Agent
from sandboxctl.sandboxd.errors import NoSuchSandbox
from sandboxctl.sandboxd.events import EventLog
from sandboxctl.sandboxd.runtime import Identity, Runtime, RuntimeFailure, SandboxSpec


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
        )


@dataclass(frozen=True, slots=True)
class RuntimeSandbox:
    """One claimed sandbox through the runtime that runs it."""

    spec: SandboxSpec
    identity: Identity
    runtime: Runtime
    events: EventLog

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

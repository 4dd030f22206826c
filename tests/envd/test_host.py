"""envd over stand-ins for the agent: it needs only the protocol of ``envd.host``, so no
agent, runtime or root is involved here. The stand-in runs commands through the real
shim of ``sandboxd.entering``, as plain host processes."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace

import httpx

from sandboxctl.envd.app import create_envd_app
from sandboxctl.envd.host import (
    Command,
    Entry,
    RunningSandbox,
    SandboxUnavailable,
    StartedCommand,
)
from sandboxctl.envd.target import Target
from sandboxctl.sandboxd import entering
from tests.apiserver.helpers import serving


@dataclass
class HostProcess:
    """A "sandbox" that runs commands as plain host processes."""

    id: str = "sb_1"
    env: Mapping[str, str] = field(default_factory=lambda: {"FROM_CLAIM": "yes"})
    signals: list[tuple[int, int]] = field(default_factory=list)
    logged: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    def enter(self, command: Command) -> Entry:
        command = replace(command, env={**self.env, **command.env}, cwd="/")
        return Entry(entering.shim_argv(), entering.HOST_ENV, entering.command_script(command))

    def entered(self, leader: int) -> tuple[int, int] | None:
        return leader, leader

    def signal_command(self, pgid: int, sig: int) -> None:
        self.signals.append((pgid, sig))
        os.killpg(pgid, sig)

    def log(self, message: str, level: str = "info", **fields: str) -> None:
        self.logged.append((message, fields))

    # Nothing outlives this stand-in's process: it remembers nothing across restarts.
    def remember(self, command: StartedCommand) -> None:
        pass

    def forget(self, pid: int) -> None:
        pass

    def remembered(self, skip: Collection[int] = ()) -> list[StartedCommand]:
        return []

    def signal_remembered(self, command: StartedCommand, sig: int) -> bool:
        return False


@dataclass
class Sandboxes:
    running_ids: set[str]
    paused_ids: set[str]

    def running(self, sandbox_id: str) -> RunningSandbox:
        if sandbox_id in self.paused_ids:
            raise SandboxUnavailable(sandbox_id, paused=True)
        if sandbox_id not in self.running_ids:
            raise SandboxUnavailable(sandbox_id)
        return HostProcess(sandbox_id)


def test_a_target_runs_and_signals_commands_through_the_protocol_only() -> None:
    sandbox = HostProcess()
    target = Target(sandbox)
    assert target.id == "sb_1"

    async def scenario() -> tuple[tuple[int, bytes, bytes], int]:
        ran = await target.run(["sh", "-c", 'echo "hi $FROM_CLAIM"; echo err >&2; exit 3'])
        started = await target.start(Command(["sleep", "30"]))
        target.signal(started.process.pid, signal.SIGTERM)
        return ran, await started.process.wait()

    (status, out, err), ended = asyncio.run(scenario())
    assert (status, out, err) == (3, b"hi yes\n", b"err\n")
    assert ended == -signal.SIGTERM
    assert sandbox.signals[0][1] == signal.SIGTERM


def test_a_sandbox_the_host_cannot_give_answers_502_in_the_sdks_words() -> None:
    app = create_envd_app(Sandboxes({"sb_up"}, {"sb_paused"}), lambda request, sandbox_id: True)
    with serving(app) as url, httpx.Client(base_url=url) as client:
        assert client.get("/v1/sandboxes/sb_up/envd/health").status_code == 204
        for sandbox_id, text in (("sb_paused", "is paused"), ("sb_gone", "was not found")):
            response = client.get(f"/v1/sandboxes/{sandbox_id}/envd/health")
            assert response.status_code == 502
            assert response.json() == {"code": 502, "message": f"The sandbox {sandbox_id} {text}"}

"""The commands an agent keeps for its next process (``envd_host.CommandBook``) reach
only their own sandbox: an entry naming another sandbox's command or a host process, as
a stale or forged one might, is neither listed nor signalled. (That a restarted agent
lists and kills what its earlier process started: tests/fleet/test_serve.py.)"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from sandboxctl.sandboxd import procfs
from sandboxctl.sandboxd.envd_host import COMMANDS_DIR
from tests.envd.conftest import Host
from tests.envd.wire import Envd
from tests.sandboxd.servers import wait_until

KILL = "SIGNAL_SIGKILL"


def _book(host: Host, sandbox: Envd) -> Path:
    return host.agent.settings.state_dir / COMMANDS_DIR / sandbox.sandbox_id


def _listed(sandbox: Envd) -> list[int]:
    answer = sandbox.rpc("process.Process/List", {})
    assert answer.status_code == 200, answer.text
    return [row["pid"] for row in answer.json()["processes"]]


def test_an_entry_naming_another_sandboxs_command_or_a_host_process_reaches_neither(
    host: Host, fresh: Envd
) -> None:
    other = host.claim()
    try:
        command = other.background(
            "process.Process/Start",
            {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "sleep 600"]}},
        )
        theirs = command.listed()["pid"]
        kept = json.loads((_book(host, other) / f"{theirs}.json").read_text())
        host_process = subprocess.Popen(["sleep", "600"], start_new_session=True)
        try:
            stat = procfs.read_stat(host_process.pid)
            assert stat is not None
            forged = {
                4242: kept,  # the other sandbox's command, with its very start time
                4343: {
                    **kept,
                    "pid": 4343,
                    "leader": host_process.pid,
                    "host_pid": host_process.pid,
                    "start_time": stat.start_time,
                },
            }
            book = _book(host, fresh)
            book.mkdir(mode=0o700, parents=True, exist_ok=True)
            for pid, body in forged.items():
                (book / f"{pid}.json").write_text(json.dumps(body))

            assert _listed(fresh) == []
            for pid in forged:
                refused = fresh.rpc(
                    "process.Process/SendSignal", {"process": {"pid": pid}, "signal": KILL}
                )
                assert (refused.status_code, refused.json()["code"]) == (404, "not_found")
            assert host_process.poll() is None
            assert theirs in _listed(other)
            assert not os.listdir(book)  # what does not check out is dropped
        finally:
            host_process.kill()
            host_process.wait()
        kill = {"process": {"pid": theirs}, "signal": KILL}
        killed = other.rpc("process.Process/SendSignal", kill)
        assert killed.status_code == 200
        command.result()
        wait_until(lambda: theirs not in _listed(other), what="their command to end")
        assert not (_book(host, other) / f"{theirs}.json").exists()  # forgotten at its end
    finally:
        host.agent.release(other.sandbox_id)

"""The commands an agent keeps for its next process (``commandbook.CommandBook``) reach
only their own sandbox: an entry naming another sandbox's command or a host process, as
a stale or forged one might, is neither listed nor signalled. (That a restarted agent
lists and kills what its earlier process started: tests/fleet/test_serve.py.)"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from sandboxctl.sandboxd import procfs
from sandboxctl.sandboxd.commandbook import COMMANDS_DIR, MAX_BYTES
from tests.envd.conftest import Host
from tests.envd.wire import Background, Envd
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


def test_a_command_is_kept_root_only_and_past_the_sandboxs_bound_runs_unkept(
    host: Host, fresh: Envd, caplog: pytest.LogCaptureFixture
) -> None:
    def start(tag: str) -> tuple[Background, int]:
        sleep = {"cmd": "/bin/bash", "args": ["-l", "-c", "sleep 600"]}
        command = fresh.background("process.Process/Start", {"process": sleep, "tag": tag})
        rows = lambda: fresh.rpc("process.Process/List", {}).json()["processes"]  # noqa: E731
        row = wait_until(lambda: [r for r in rows() if r.get("tag") == tag], what=tag)
        return command, row[0]["pid"]

    kept, kept_pid = start("kept")
    book = _book(host, fresh)
    entry = book / f"{kept_pid}.json"
    assert [stat.S_IMODE(p.stat().st_mode) for p in (book.parent, book, entry)] == [
        0o700,
        0o700,
        0o600,
    ]
    assert {p.stat().st_uid for p in (book.parent, entry)} == {0}

    (book / ".filler").write_bytes(b" " * MAX_BYTES)  # as if its commands' were that large
    unkept, unkept_pid = start("unkept")
    wait_until(lambda: "could not keep command" in caplog.text, what="the warning")
    assert sorted(os.listdir(book)) == [".filler", f"{kept_pid}.json"]
    for command, pid in ((kept, kept_pid), (unkept, unkept_pid)):  # both ran, and end
        killed = fresh.rpc("process.Process/SendSignal", {"process": {"pid": pid}, "signal": KILL})
        assert killed.status_code == 200
        command.result()
    wait_until(lambda: not _listed(fresh), what="both commands to end")
    assert os.listdir(book) == [".filler"]

"""A corrupt state database stops the agent with one line
naming the file and the way out (exit 2), and ``--recover`` moves it aside and destroys
the sandboxes it held, saying which, before starting afresh."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx

from sandboxctl.sandboxd import procfs
from tests.sandboxd.servers import agent_process, free_port, wait_until


def _agent_args(state_dir: Path, address: str, uid_base: int, *extra: str) -> list[str]:
    return [
        "--listen", address, "--state-dir", str(state_dir), "--pool", "base=1",
        "--uid-base", str(uid_base), "--max-sandboxes", "4", *extra,
    ]  # fmt: skip


def _uids_running(uid_base: int) -> set[int]:
    return {uid for uid in range(uid_base, uid_base + 4) if procfs.pids_of_uid(uid)}


def test_a_corrupt_state_database_is_one_line_and_recover_starts_afresh(
    state_dir: Path, uid_base: int
) -> None:
    address = f"127.0.0.1:{free_port()}"
    args = _agent_args(state_dir, address, uid_base)
    with agent_process(args, address) as agent:
        claimed = httpx.post(f"http://{address}/v1/claim", json={"template": "base"}).json()
        wait_until(lambda: len(_uids_running(uid_base)) == 2, what="a claimed and a warm one")
        agent.send_signal(signal.SIGKILL)
        agent.wait()
    before = _uids_running(uid_base)
    assert len(before) == 2  # they outlive the agent
    database = state_dir / "sandboxd.sqlite"
    for part in state_dir.glob("sandboxd.sqlite*"):  # the write-ahead log too
        part.write_bytes(b"this is not a database" * 100)

    command = [sys.executable, "-m", "sandboxctl", "serve-sandboxd", *args]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 2
    assert "Traceback" not in refused.stderr
    [line] = [line for line in refused.stderr.splitlines() if line.startswith("sandboxctl:")]
    assert str(database) in line
    assert "--recover" in line
    assert _uids_running(uid_base) == before  # nothing was touched

    log = state_dir / "recover.log"
    with (
        log.open("wb") as output,
        agent_process([*args, "--recover", "--destroy-on-exit"], address, output=output),
    ):
        # Both sandboxes of the lost database are destroyed; the pool is refilled.
        mine = httpx.get(f"http://{address}/v1/sandboxes/{claimed['id']}")
        assert mine.status_code == 404
        again = httpx.post(f"http://{address}/v1/claim", json={"template": "base"})
        assert again.status_code == 200, again.text
    text = log.read_text()
    assert f"destroyed sandbox {claimed['id']} (uid " in text
    assert text.count("--recover: destroyed sandbox ") == 2
    assert "Traceback" not in text
    [broken] = state_dir.glob("sandboxd.sqlite.broken-*")
    assert broken.read_bytes().startswith(b"this is not a database")


def test_recover_with_a_good_database_changes_nothing(state_dir: Path, uid_base: int) -> None:
    address = f"127.0.0.1:{free_port()}"
    args = _agent_args(state_dir, address, uid_base)
    with agent_process(args, address) as agent:
        claimed = httpx.post(f"http://{address}/v1/claim", json={"template": "base"}).json()
        agent.send_signal(signal.SIGKILL)
        agent.wait()
    log = state_dir / "recover.log"
    with (
        log.open("wb") as output,
        agent_process([*args, "--recover", "--destroy-on-exit"], address, output=output),
    ):
        mine = httpx.get(f"http://{address}/v1/sandboxes/{claimed['id']}")
        assert mine.status_code == 200  # adopted, as without the flag
    assert "reads: nothing to recover" in log.read_text()
    assert not list(state_dir.glob("sandboxd.sqlite.broken-*"))

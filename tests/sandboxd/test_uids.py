"""Agents on one host never give one uid to two live
sandboxes, whether they share a uid base, lost their state database, or meet a process
that already runs as a uid of their range."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from sandboxctl.sandboxd import procfs
from sandboxctl.sandboxd.agent import Agent
from tests.sandboxd.conftest import BASE
from tests.sandboxd.servers import agent_process, free_port, wait_until


def test_a_uid_a_process_runs_as_is_skipped_and_logged(
    make_agent: Callable[..., Agent],
    uid_base: int,
    as_uid: Callable[[int], subprocess.Popen[bytes]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    stranger = as_uid(uid_base)  # no uid claims here: only the process tells
    agent = make_agent(pools={BASE: 2})
    assert agent.refill_once() == 2
    uids = {record.uid for record in agent._records.values()}
    assert uids == {uid_base + 1, uid_base + 2}
    assert f"uid {uid_base} is taken" in caplog.text
    agent.stop(destroy=True)  # destroying kills every process of each sandbox's uid...
    assert stranger.poll() is None  # ...and the stranger's uid was never one of them


def _uids_of(state_dir: Path) -> set[int]:
    """The uids of an agent's live sandboxes: the group of each one's passwd file."""
    homes = (state_dir / "runtime").resolve() / "homes"
    return {passwd.stat().st_gid for passwd in homes.glob("*.passwd")}


def _namespaces_of(uid: int) -> set[int | None]:
    """The pid namespaces of a uid's processes, but the host's (where each sandbox's
    launcher runs): one per sandbox."""
    found = {procfs.pid_namespace(pid) for pid in procfs.pids_of_uid(uid)}
    return found - {None, procfs.pid_namespace(os.getpid())}


def test_two_agents_from_one_uid_base_share_no_uid_and_a_lost_database_frees_its_own(
    uid_base: int,
) -> None:
    """Two `serve-sandboxd` on the same --uid-base (as two fleets on the default one)."""
    with tempfile.TemporaryDirectory(prefix="sandboxctl-uids-", dir="/tmp") as top:
        first, second = Path(top) / "first", Path(top) / "second"
        addresses = [f"127.0.0.1:{free_port()}" for _ in range(2)]

        def args(state: Path, address: str) -> list[str]:
            return [
                "--listen", address, "--state-dir", str(state), "--pool", "base=2",
                "--uid-base", str(uid_base), "--max-sandboxes", "4",
            ]  # fmt: skip

        with agent_process(args(first, addresses[0]), addresses[0]) as one:
            with agent_process([*args(second, addresses[1]), "--destroy-on-exit"], addresses[1]):
                for address in addresses:
                    claim = httpx.post(f"http://{address}/v1/claim", json={"template": "base"})
                    assert claim.status_code == 200, claim.text
                # A sandbox's passwd file is written before its processes start: wait for
                # each uid's sandbox to run (a namespace of its own), not only for its file.
                wait_until(
                    lambda: (
                        len(_uids_of(first)) == len(_uids_of(second)) == 3
                        and all(_namespaces_of(uid) for uid in _uids_of(first) | _uids_of(second))
                    ),
                    what="three running sandboxes each",
                )
                mine, theirs = _uids_of(first), _uids_of(second)
                assert not mine & theirs
                for uid in mine | theirs:  # one sandbox (one pid namespace) per uid
                    assert len(_namespaces_of(uid)) == 1, uid

                # The first agent is killed and its database lost; its sandboxes run on.
                one.send_signal(signal.SIGKILL)
                one.wait()
                for part in first.glob("sandboxd.sqlite*"):
                    part.unlink()
            # The second stopped with --destroy-on-exit: its uids are free again.
            log = Path(top) / "again.log"
            with (
                log.open("wb") as output,
                agent_process(
                    [*args(first, addresses[0]), "--destroy-on-exit"], addresses[0], output=output
                ),
            ):
                # The orphans it claimed but no longer knows are killed, not handed out
                # beside a new sandbox of the same uid.
                wait_until(lambda: len(_uids_of(first)) == 2, what="its pool, refilled")
                for uid in range(uid_base, uid_base + 8):
                    assert len(_namespaces_of(uid)) <= 1, uid
            text = log.read_text()
            for uid in mine:
                assert f"freed uid {uid}: claimed by this agent" in text

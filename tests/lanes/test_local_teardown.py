"""The local kit's teardown kills what its agents left in its uid range (an agent killed by
a lane that never came back), and nothing of another fleet's that shares the range."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from sandboxctl.lanes.local import LocalKit
from sandboxctl.sandboxd.runtimedir import RUNTIME_ROOT_ENV, UIDS, runtime_dir
from sandboxctl.sandboxd.uids import UidClaims
from tests.sandboxd.conftest import as_uid  # noqa: F401 (the fixture)


def test_teardown_kills_only_the_sandboxes_its_agents_hold(
    tmp_path: Path,
    uid_base: int,
    as_uid: Callable[[int], subprocess.Popen[bytes]],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = tmp_path / "runtime"
    monkeypatch.setenv(RUNTIME_ROOT_ENV, str(root))
    workdir = tmp_path / "kit"
    workdir.mkdir()
    kit = LocalKit(workdir, uid_base)  # built, not started: no namespace, no process
    ours, theirs = as_uid(uid_base + 1), as_uid(uid_base + 2)
    agent_a = runtime_dir(kit.hosts["A"].state_dir, root).path
    assert UidClaims(root.resolve() / UIDS, agent_a).take(uid_base + 1, running=True)
    other = tmp_path / "another-fleet"
    assert UidClaims(root.resolve() / UIDS, other).take(uid_base + 2, running=True)

    kit._kill_sandboxes()

    assert ours.wait(timeout=10) == -signal.SIGKILL
    assert theirs.poll() is None

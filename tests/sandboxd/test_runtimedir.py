"""The runtime dir (what sandbox uids reach, apart from the private state dir) and the
host-wide uid claims that keep two agents on one host from sharing a uid."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandboxctl.core.errors import ConfigurationError
from sandboxctl.sandboxd import procfs
from sandboxctl.sandboxd.agent import Agent
from sandboxctl.sandboxd.bubblewrap import passwd_paths
from sandboxctl.sandboxd.errors import StateDirInUse
from sandboxctl.sandboxd.runtimedir import (
    OWNER_LOCK,
    STATE_LOCK,
    RuntimeDir,
    check_root,
    collect_gone,
    link,
    lock_held,
    prepare,
    refuse_state_dir_in_use,
    runtime_dir,
)
from sandboxctl.sandboxd.uids import UidClaims
from tests.sandboxd.conftest import BASE
from tests.sandboxd.servers import agent_process, free_port, status_of, wait_until


@pytest.fixture
def top() -> Iterator[Path]:
    """A directory every uid may traverse, for runtime roots and state dirs (ask for it
    before make_agent: the agents are stopped before it goes)."""
    path = Path(tempfile.mkdtemp(prefix="sandboxctl-runtimedir-", dir="/tmp"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _layout(top: Path, name: str) -> RuntimeDir:
    return runtime_dir(top / name / ".sandboxctl", top / "lib" / "runtime")


def _prepared(layout: RuntimeDir) -> RuntimeDir:
    """What a start that has since stopped leaves: the runtime dir, its owner lock free."""
    with prepare(layout):
        link(layout)
    return layout


def test_the_runtime_dir_is_keyed_by_the_real_path_of_the_state_dir(top: Path) -> None:
    (top / "a").mkdir()
    (top / "link").symlink_to(top / "a")
    root = top / "runtime"
    one = runtime_dir(top / "a" / "state", root)
    assert runtime_dir(top / "link" / "state", root).path == one.path
    assert runtime_dir(top / "b" / "state", root).path != one.path
    assert one.path.parent == root
    assert one.homes == one.path / "homes"
    assert one.link == top / "a" / "state" / "runtime"


def test_prepare_makes_the_layout_and_a_second_start_reuses_it(top: Path) -> None:
    layout = _layout(top, "checkout")
    with prepare(layout):
        assert not layout.state_dir.exists()  # the runtime dir comes first, locked
        link(layout)

    for directory in (top / "lib", layout.root, layout.path):
        info = directory.stat()
        assert (info.st_uid, _mode(directory)) == (0, 0o711), directory
    assert _mode(layout.uids) == 0o700
    assert _mode(layout.state_dir) == 0o700
    assert (layout.path / "state-dir").read_text() == f"{layout.state_dir}\n"
    assert _mode(layout.path / "state-dir") == 0o600
    assert _mode(layout.path / "owner.lock") == 0o600
    assert os.readlink(layout.link) == str(layout.path)

    _prepared(layout)  # the next start: the same dir, nothing new
    assert sorted(p.name for p in layout.root.iterdir()) == sorted([layout.path.name, "uids"])
    assert os.readlink(layout.link) == str(layout.path)


def test_a_second_start_of_a_state_dir_is_refused_while_the_first_holds_it(top: Path) -> None:
    layout = _layout(top, "checkout")
    with prepare(layout):
        with pytest.raises(StateDirInUse) as refused:
            prepare(layout)
        assert str(refused.value) == (
            f"--state-dir {layout.state_dir} is in use by another running agent"
        )
    prepare(layout).close()  # free again once the first has stopped


def test_the_in_use_probe_sees_either_lock_and_takes_and_makes_nothing(top: Path) -> None:
    layout = _prepared(_layout(top, "checkout"))
    agent_dir = layout.state_dir / "agent"
    refused = f"--state-dir {layout.state_dir} is in use by another running agent"

    refuse_state_dir_in_use(layout.state_dir, layout, agent_dir)  # neither held, one missing
    assert not agent_dir.exists()
    with prepare(layout):
        assert lock_held(layout.path / OWNER_LOCK)
        with pytest.raises(StateDirInUse, match=re.escape(refused)):
            refuse_state_dir_in_use(layout.state_dir, layout, agent_dir)
    agent_dir.mkdir()
    held = os.open(agent_dir / STATE_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(StateDirInUse, match=re.escape(refused)):
            refuse_state_dir_in_use(layout.state_dir, layout, agent_dir)
        assert lock_held(agent_dir / STATE_LOCK)  # probing took nothing from its holder
    finally:
        os.close(held)
    assert not lock_held(agent_dir / STATE_LOCK)
    assert not lock_held(agent_dir / "missing.lock")
    assert os.listdir(agent_dir) == [STATE_LOCK]


@pytest.mark.parametrize(
    ("mode", "problem"),
    [
        (0o700, "sandbox uids cannot traverse {parent} (mode 0700)"),
        (0o777, "others may write in {parent} (mode 0777)"),
        (0o771, "others may write in {parent} (mode 0771)"),
    ],
)
def test_a_root_under_an_unsafe_directory_is_refused(top: Path, mode: int, problem: str) -> None:
    parent = top / "parent"
    parent.mkdir()
    parent.chmod(mode)
    with pytest.raises(ConfigurationError) as refused:
        check_root(parent / "runtime")
    assert problem.format(parent=parent) in str(refused.value)
    assert str(refused.value).startswith(f"--runtime-root {parent / 'runtime'}: ")
    assert not (parent / "runtime").exists()


def test_a_sticky_directory_may_be_above_the_root_but_not_be_it(top: Path) -> None:
    shared = top / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    check_root(shared / "runtime")
    with pytest.raises(ConfigurationError, match="others may write in"):
        check_root(shared)


def test_a_directory_of_another_user_is_refused(top: Path, uid_base: int) -> None:
    theirs = top / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, uid_base, uid_base)
    with pytest.raises(ConfigurationError, match=f"{theirs} is owned by uid {uid_base}, not root"):
        check_root(theirs / "runtime")


def test_uid_claims_keep_agents_apart(top: Path, uid_base: int, as_uid) -> None:  # type: ignore[no-untyped-def]
    mine, theirs = top / "mine", top / "theirs"
    mine.mkdir()
    theirs.mkdir()
    claims = UidClaims(top / "uids", mine)
    other = UidClaims(top / "uids", theirs)

    assert claims.take(uid_base)
    assert claims.take(uid_base)  # already mine
    assert not other.take(uid_base)
    assert other.holder_of(uid_base) == mine
    other.drop(uid_base)  # not theirs to drop
    assert claims.held() == {uid_base}

    claims.drop(uid_base)
    assert other.take(uid_base)

    # A claim of a runtime dir that is gone is stale...
    shutil.rmtree(theirs)
    assert claims.take(uid_base)
    # ... and a uid some process runs as is nobody's to take.
    as_uid(uid_base + 1)
    wait_until(lambda: not claims.take(uid_base + 1), what="the process to run")
    assert claims.held() == {uid_base}


def test_the_runtime_dir_of_a_gone_state_dir_is_removed(top: Path, uid_base: int, as_uid) -> None:  # type: ignore[no-untyped-def]
    gone, kept, other = _layout(top, "gone"), _layout(top, "kept"), _layout(top, "other")
    for layout in (gone, kept, other):
        _prepared(layout)
    (gone.homes / "sb_000000000000").mkdir(parents=True)
    assert UidClaims(gone.uids, gone.path).take(uid_base)
    assert UidClaims(kept.uids, kept.path).take(uid_base + 1)
    shutil.rmtree(gone.state_dir)
    shutil.rmtree(kept.state_dir)
    process = as_uid(uid_base + 1)  # a sandbox of that fleet still runs

    collect_gone(other)

    assert not gone.path.exists()
    assert UidClaims(other.uids, other.path).holder_of(uid_base) is None
    assert kept.path.is_dir()
    assert UidClaims(other.uids, other.path).holder_of(uid_base + 1) == kept.path

    process.kill()
    process.wait()
    collect_gone(other)
    assert not kept.path.exists()


def _agent_settings(layout: RuntimeDir) -> dict[str, object]:
    _prepared(layout)
    return {
        "state_dir": layout.state_dir / "sandboxd",
        "runtime_dir": layout.path,
        "uid_claims": layout.uids,
    }


def _home_uids(agent: Agent) -> set[int]:
    """The uids of the agent's sandboxes as their passwd files in the homes dir say (the
    file's group is the sandbox's uid)."""
    passwd_files = (passwd_paths(agent.spec(record))[0] for record in agent._records.values())
    return {passwd.stat().st_gid for passwd in passwd_files if passwd.is_file()}


def test_homes_live_in_the_runtime_dir_and_two_agents_share_no_uid(top: Path, make_agent) -> None:  # type: ignore[no-untyped-def]
    first_layout, second_layout = _layout(top, "first"), _layout(top, "second")
    # Both from the same uid base, as two `make serve` runs.
    first: Agent = make_agent(pools={BASE: 2}, **_agent_settings(first_layout))
    second: Agent = make_agent(pools={BASE: 2}, **_agent_settings(second_layout))
    assert first.refill_once() == 2
    assert second.refill_once() == 2

    homes = {first.spec(record).home.parent for record in first._records.values()}
    assert homes == {first_layout.homes}
    assert not (first_layout.state_dir / "sandboxd" / "homes").exists()
    first_uids, second_uids = _home_uids(first), _home_uids(second)
    assert len(first_uids) == len(second_uids) == 2
    assert not first_uids & second_uids

    # Destroying one agent's sandboxes leaves the other's alone, and frees the uids.
    first.stop(destroy=True)
    assert list(first_layout.homes.iterdir()) == []
    assert all(second.runtime.alive(second.identity(r)) for r in second._records.values())
    assert UidClaims(first_layout.uids, first_layout.path).held() == set()
    assert UidClaims(second_layout.uids, second_layout.path).held() == second_uids


def test_a_sandbox_from_before_runtime_dirs_is_adopted_and_cleaned_up(  # type: ignore[no-untyped-def]
    top: Path, make_agent
) -> None:
    layout = _layout(top, "old")
    settings = _agent_settings(layout)
    layout.state_dir.chmod(0o711)  # as old agents needed: their sandbox uids went through it
    old: Agent = make_agent(pools={BASE: 1}, state_dir=settings["state_dir"])  # homes inside
    assert old.refill_once() == 1
    [record] = old._records.values()
    old_home = layout.state_dir / "sandboxd" / "homes" / record.id
    assert old_home.with_name(f"{record.id}.passwd").is_file()
    old.stop()  # the sandbox keeps running

    new: Agent = make_agent(pools={BASE: 1}, **settings)
    assert new.adopt().adopted == (record.id,)
    assert new.spec(new._records[record.id]).home == old_home
    assert UidClaims(layout.uids, layout.path).held() == {record.uid}

    new.set_pools({})  # drains the adopted sandbox: its old home goes, then the old dir
    assert not list(old_home.parent.glob(f"{record.id}*"))
    new.stop()
    again: Agent = make_agent(pools={}, **settings)
    again.adopt()
    assert not (layout.state_dir / "sandboxd" / "homes").exists()


def test_a_start_cut_short_leaves_nothing_the_next_start_keeps(  # type: ignore[no-untyped-def]
    top: Path, make_agent, uid_base: int, as_uid
) -> None:
    layout = _layout(top, "crashed")
    settings = _agent_settings(layout)
    # What an agent killed mid-start leaves: a home, its passwd file, a claimed uid with a
    # process running as it, and no row.
    layout.homes.mkdir()
    (layout.homes / "sb_0123456789ab").mkdir()
    (layout.homes / "sb_0123456789ab.passwd").write_text("")
    assert UidClaims(layout.uids, layout.path).take(uid_base + 5)
    process = as_uid(uid_base + 5)

    agent: Agent = make_agent(pools={}, **settings)
    agent.adopt()

    assert list(layout.homes.iterdir()) == []
    assert process.wait(timeout=10) == -9
    assert UidClaims(layout.uids, layout.path).held() == set()


def _serve_sandboxd(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sandboxctl", "serve-sandboxd", "--listen", "127.0.0.1:0"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=60)


def test_serve_sandboxd_refuses_an_unsafe_runtime_root_and_writes_nothing(top: Path) -> None:
    private = top / "private"
    private.mkdir(mode=0o700)
    done = _serve_sandboxd(
        "--state-dir", str(top / "state"), "--runtime-root", str(private / "runtime")
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        f"sandboxctl: error: --runtime-root {private / 'runtime'}: sandbox uids cannot "
        f"traverse {private} (mode 0700); pick a runtime root that every uid may traverse "
        "and only root may write (--runtime-root or SANDBOXCTL_RUNTIME_ROOT; default "
        "/var/lib/sandboxctl/runtime)"
    )
    assert not (top / "state").exists()
    assert not (private / "runtime").exists()


def test_serve_sandboxd_refuses_a_template_sandbox_uids_cannot_reach(top: Path) -> None:
    private = top / "private"
    (private / "root").mkdir(parents=True)
    private.chmod(0o700)
    done = _serve_sandboxd("--state-dir", str(top / "state"), "--template", f"py={private}/root")
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        f"sandboxctl: error: --template 'py={private}/root': sandbox uids cannot traverse "
        f"{private} (mode 0700); keep templates where every uid may traverse"
    )


def test_serve_sandboxd_refuses_a_runtime_root_its_uids_cannot_reach(
    top: Path, uid_base: int
) -> None:
    """Modes alone do not say who may pass. A directory of group ``uid_base``
    with no group bits (0701) lets every uid through but the sandbox's own; every claim
    would then fail in bubblewrap, so the agent refuses to start, in one line."""
    gate = top / "gate"
    gate.mkdir(mode=0o701)
    gate.chmod(0o701)
    os.chown(gate, 0, uid_base)
    check_root(gate / "runtime")  # the modes pass
    command = [
        sys.executable, "-m", "sandboxctl", "serve-sandboxd",
        "--listen", f"127.0.0.1:{free_port()}", "--state-dir", str(top / "state"),
        "--runtime-root", str(gate / "runtime"), "--uid-base", str(uid_base), "--pool", "base=1",
    ]  # fmt: skip
    refused = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 2, refused.stderr
    [line] = [line for line in refused.stderr.splitlines() if line.startswith("sandboxctl:")]
    assert line.startswith(f"sandboxctl: error: --runtime-root {gate / 'runtime'}: sandbox uids")
    assert f"(uid {uid_base} was refused)" in line
    assert "Traceback" not in refused.stderr


# --- a runtime dir is collected only when its agent is gone for good ----------------------


def _agent_args(top: Path, name: str, uid_base: int) -> tuple[list[str], str, RuntimeDir]:
    """``serve-sandboxd`` flags for an agent of state dir ``top/name/sd`` under the
    shared runtime root of ``_layout``; its address and its runtime dir."""
    address = f"127.0.0.1:{free_port()}"
    state_dir = top / name / "sd"
    args = [
        "--listen", address, "--state-dir", str(state_dir),
        "--runtime-root", str(top / "lib" / "runtime"), "--uid-base", str(uid_base),
    ]  # fmt: skip
    return args, address, runtime_dir(state_dir, top / "lib" / "runtime")


def _gone(top: Path, name: str) -> RuntimeDir:
    """The runtime dir of a fleet that stopped and whose state dir was then deleted: what
    the next successful start removes."""
    layout = _prepared(_layout(top, name))
    shutil.rmtree(layout.state_dir)
    return layout


def test_a_fleet_still_starting_keeps_its_runtime_dir_before_its_state_dir_exists(
    top: Path, uid_base: int
) -> None:
    """A first start holds its runtime dir (``serve``: from the moment its ports are
    bound, through the template build) before its state dir is made. Another agent's
    start meanwhile must leave it, and remove it only once that start has ended."""
    starting = _layout(top, "bench")
    gone = _gone(top, "gone")
    owner = prepare(starting)  # the benchmark's fleet, starting
    assert not starting.state_dir.exists()
    args, address, _ = _agent_args(top, "other", uid_base)
    with agent_process(args, address):
        pass
    assert (starting.path / "state-dir").read_text() == f"{starting.state_dir}\n"
    assert not gone.path.exists()  # that start did collect: what was gone went

    owner.close()  # the benchmark's fleet gave up before making its state dir
    with agent_process(args, address):
        pass
    assert not starting.path.exists()


def test_a_running_agent_keeps_its_runtime_dir_when_its_state_dir_is_deleted(
    top: Path, uid_base: int
) -> None:
    """A state dir deleted under a running agent (a temporary fleet's cleanup racing its
    stop) does not make the agent gone: its runtime dir stays and it still starts
    sandboxes there, with uids no other agent may take."""
    first_args, first, first_dir = _agent_args(top, "first", uid_base)
    second_args, second, _ = _agent_args(top, "second", uid_base)
    with agent_process(first_args, first):
        shutil.rmtree(first_dir.state_dir)
        with agent_process(second_args, second):
            pass
        assert (first_dir.path / "state-dir").is_file()
        pools = {"pools": [{"template": "base", "warm": 1}]}
        assert httpx.put(f"http://{first}/v1/pools", json=pools, timeout=10).status_code == 200

        def warm() -> int:
            info = httpx.get(f"http://{first}/v1/info", timeout=5).json()
            return sum(pool["warm"] for pool in info["pools"])

        wait_until(lambda: warm() == 1, timeout=60, what="a warm sandbox of the first agent")
        [uid] = UidClaims(first_dir.uids, first_dir.path).held()
        assert [p.name for p in first_dir.homes.glob("*.passwd")]
        httpx.put(f"http://{first}/v1/pools", json={"pools": []}, timeout=30)
        wait_until(lambda: not procfs.pids_of_uid(uid), timeout=20, what="the sandbox to go")


def test_a_refused_start_changes_nothing(top: Path, uid_base: int) -> None:
    """A start refused because its state dir is in use, or because its port is taken,
    leaves every other runtime dir as it was (and makes no state dir of its own); the
    next start that succeeds is the one that removes what is gone."""
    args, address, running = _agent_args(top, "running", uid_base)
    with agent_process(args, address):
        gone = _gone(top, "gone")  # since that start
        again = [a if a != address else f"127.0.0.1:{free_port()}" for a in args]
        refused = subprocess.run(
            [sys.executable, "-m", "sandboxctl", "serve-sandboxd", *again],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.splitlines()[-1] == (
            f"sandboxctl: error: --state-dir {running.state_dir} is in use by another running agent"
        )
        taken_args, _, taken = _agent_args(top, "taken", uid_base)
        taken_args[taken_args.index("--listen") + 1] = address
        taken_port = subprocess.run(
            [sys.executable, "-m", "sandboxctl", "serve-sandboxd", *taken_args],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert taken_port.returncode == 2, taken_port.stderr
        assert "Address already in use" in taken_port.stderr.splitlines()[-1]
        assert not taken.state_dir.exists()
        assert not taken.path.exists()
        assert (gone.path / "state-dir").is_file()
        assert status_of(f"http://{address}/metrics") == 200  # the running one is untouched
    with agent_process(args, address):  # a start that succeeds collects
        pass
    assert not gone.path.exists()

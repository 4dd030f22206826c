"""The runtimes against the real kernel: real sandboxes, real processes, no mocks.

Needs root and bubblewrap (conftest.py skips otherwise). Every sandbox a test starts
is destroyed in the fixture's teardown, also when the test fails.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sandboxctl.envd.host import Command, Entry
from sandboxctl.sandboxd import entering, procfs
from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime
from sandboxctl.sandboxd.cgroups import UNIFIED, Cgroups
from sandboxctl.sandboxd.runtime import (
    SIZE_LIMITS,
    Identity,
    Limits,
    RuntimeFailure,
    SandboxSpec,
    Size,
)
from sandboxctl.sandboxd.unsafe import UnsafeProcessRuntime
from tests.conftest import process_slot

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="real sandboxes need root"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

SMALL = SIZE_LIMITS[Size.SMALL]
CGROUP_PARENT = "sandboxctl-test"
# Apart from the uid_base fixture's blocks (400_000+) and from another test process.
_UID_BASE = 270_000 + (process_slot() % 400) * 50
_uids = itertools.count(_UID_BASE)
Runtime = BubblewrapRuntime | UnsafeProcessRuntime


def _free_uid() -> int:
    for uid in _uids:
        if not procfs.pids_of_uid(uid):
            return uid
    raise AssertionError("unreachable")


def _poll(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    return procfs.wait_until(timeout, predicate)


@dataclass
class Box:
    runtime: Runtime
    spec: SandboxSpec
    identity: Identity
    background: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def command(self, *argv: str) -> Entry:
        return self.runtime.enter(self.spec, self.identity, Command(argv))

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return entering.run(self.command(*argv), timeout=30, text=True)

    def sh(self, script: str) -> subprocess.CompletedProcess[str]:
        return self.run("/bin/sh", "-c", script)

    def ok(self, script: str) -> str:
        result = self.sh(script)
        assert result.returncode == 0, (script, result.stderr)
        return result.stdout

    def spawn(self, script: str) -> subprocess.Popen[bytes]:
        """A background process inside, in a session of its own (stop it with killpg)."""
        proc = entering.popen(
            self.command("/bin/sh", "-c", script),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.background.append(proc)
        return proc


@pytest.fixture(scope="module")
def homes() -> Iterator[Path]:
    """Homes' parent: sandbox uids must traverse it (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="sandboxctl-runtime-", dir="/tmp"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def cgroups() -> Iterator[Cgroups]:
    cg = Cgroups(parent=CGROUP_PARENT)
    yield cg
    for d in Path("/sys/fs/cgroup").glob(f"*/{CGROUP_PARENT}"):
        with contextlib.suppress(OSError):  # another session may still use it
            d.rmdir()


@pytest.fixture(scope="module")
def runtime(cgroups: Cgroups) -> BubblewrapRuntime:
    return BubblewrapRuntime(cgroups=cgroups)


@pytest.fixture
def sandboxes(runtime: BubblewrapRuntime, homes: Path) -> Iterator[Callable[..., Box]]:
    """start(limits=SMALL, runtime=...) -> a running Box."""
    started: list[tuple[Runtime, SandboxSpec, list[Box]]] = []

    def start(limits: Limits = SMALL, runtime: Runtime = runtime) -> Box:
        uid = _free_uid()
        sandbox_id = f"rt{os.getpid()}-{uid}"
        spec = SandboxSpec(
            id=sandbox_id,
            uid=uid,
            root=Path("/"),
            home=homes / sandbox_id,
            limits=limits,
            hostname=f"box-{uid}",
        )
        boxes: list[Box] = []
        started.append((runtime, spec, boxes))
        box = Box(runtime, spec, runtime.start(spec))
        boxes.append(box)
        return box

    yield start
    failures = []
    for rt, spec, boxes in reversed(started):
        try:
            rt.destroy(spec, boxes[0].identity if boxes else None)
        except Exception as exc:  # keep cleaning up the others
            failures.append(exc)
        for box in boxes:
            for proc in box.background:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    assert not failures


def _stat(pid: int) -> procfs.ProcStat:
    stat = procfs.read_stat(pid)
    assert stat is not None, f"no process {pid}"
    return stat


def _uid_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(x for x in status.splitlines() if x.startswith("Uid:"))
    return int(line.split()[1])


def _status(box: Box, key: str) -> str:
    line = [x for x in box.ok("cat /proc/self/status").splitlines() if x.startswith(key + ":")]
    return line[0].split(":", 1)[1].strip()


# --- bubblewrap: isolation ---------------------------------------------------------------


def test_check_passes_on_this_host() -> None:
    BubblewrapRuntime.check()


def test_runs_as_its_uid_sees_only_its_processes_and_a_read_only_root(
    sandboxes: Callable[..., Box],
) -> None:
    box = sandboxes()
    uid = box.spec.uid
    members = procfs.pids_in_pid_namespace(box.identity.pid_namespace)
    assert box.identity.pid in members
    assert {_uid_of(pid) for pid in [*members, _stat(box.identity.pid).ppid]} == {uid}

    assert box.ok("id -u; id -un; pwd; hostname").split() == [
        str(uid),
        "user",
        "/home/user",
        box.spec.hostname,
    ]
    inside = [line.split() for line in box.ok("ps -eo pid=,comm=").splitlines()]
    # init, its sleep, and this command: the shell and its ps
    assert sorted(comm for _, comm in inside) == ["bwrap", "ps", "sh", "sleep"]
    assert {pid for pid, comm in inside if comm in ("bwrap", "sleep")} == {"1", "2"}
    assert box.ok("ls /home") == "user\n"
    assert _status(box, "CapEff") == "0000000000000000"
    assert _status(box, "NoNewPrivs") == "1"
    assert _status(box, "Groups") == ""

    assert box.sh("cat /etc/shadow").returncode != 0
    assert box.sh("touch /usr/x").returncode != 0
    assert box.sh("touch /etc/x").returncode != 0
    assert box.sh("unshare -U true").returncode != 0  # no nested user namespaces
    box.ok("touch /home/user/x /tmp/x")
    assert _inside(box, "/home/user/x").stat().st_uid == uid
    assert not box.spec.home.exists()  # the home is a tmpfs inside the sandbox
    assert box.ok("stat -c %s /home/user/x") == "0\n"


def test_two_sandboxes_cannot_see_each_other(sandboxes: Callable[..., Box]) -> None:
    a, b = sandboxes(), sandboxes()
    b.ok("echo secret > /home/user/secret; echo secret > /tmp/secret")
    assert b.ok("cat /home/user/secret /tmp/secret") == "secret\nsecret\n"

    assert a.ok("ls -A /home") == "user\n"
    assert a.ok("ls -A /home/user") == ""
    assert a.ok("ls -A /tmp") == ""
    b_home = _inside(b, "/home/user")
    assert a.sh(f"ls {b_home}").returncode != 0  # b's pid is not in a's /proc
    assert a.sh(f"cat {b_home}/secret").returncode != 0
    # a's /proc holds only its own namespace's few small pids: none of b's, no host pid
    visible = {int(name) for name in a.ok("ls /proc").split() if name.isdigit()}
    assert max(visible) < 20
    assert b.identity.pid not in visible


def test_every_sandbox_has_a_network_namespace_with_only_loopback(
    sandboxes: Callable[..., Box],
) -> None:
    """Without the agent's network (which adds a veth, tests/sandboxd/network) a sandbox cannot
    reach the host: its loopback is its own."""
    isolated = sandboxes()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]
        connect = f"import socket; socket.create_connection(('127.0.0.1', {port}), 3).close()"

        devices = isolated.ok("tail -n +3 /proc/net/dev | cut -d: -f1").split()
        assert devices == ["lo"]
        if shutil.which("ip"):
            links = isolated.ok("ip -o link").splitlines()
            assert [line.split(":")[1].strip() for line in links] == ["lo"]
        refused = isolated.run("python3", "-c", connect)
        assert refused.returncode != 0
        assert "ConnectionRefused" in refused.stderr or "unreachable" in refused.stderr


# --- bubblewrap: lifecycle ---------------------------------------------------------------


def _counter(box: Box) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(_inside(box, "/home/user/counter").read_text())
    return None


def _inside(box: Box, path: str) -> Path:
    """A path of the sandbox's own mounts (its home is a tmpfs there), seen from the host."""
    return Path(f"/proc/{box.identity.pid}/root{path}")


def _frozen_by_kernel(runtime: BubblewrapRuntime, cgroups: Cgroups, box: Box) -> bool:
    if runtime.freeze_mode == "cgroup-v2":
        events = (cgroups.path(UNIFIED, box.spec.id) / "cgroup.events").read_text()
        return "frozen 1" in events.splitlines()
    if runtime.freeze_mode == "cgroup-v1":
        state = (cgroups.path("freezer", box.spec.id) / "freezer.state").read_text()
        return state.strip() == "FROZEN"
    members = procfs.pids_in_pid_namespace(box.identity.pid_namespace)
    return all(_stat(pid).state == "T" for pid in members)


def test_freeze_stops_every_process_and_thaw_resumes(
    sandboxes: Callable[..., Box], runtime: BubblewrapRuntime, cgroups: Cgroups
) -> None:
    box = sandboxes()
    # a rename, so that the counter file is never seen half written
    box.spawn("i=0; cd /home/user; while :; do i=$((i+1)); echo $i >c.new; mv c.new counter; done")
    assert _poll(lambda: _counter(box) is not None)
    first = _counter(box) or 0
    assert _poll(lambda: (_counter(box) or 0) > first)

    runtime.freeze(box.spec, box.identity)
    assert _frozen_by_kernel(runtime, cgroups, box)
    frozen_at = _counter(box)
    assert frozen_at is not None
    assert not _poll(lambda: _counter(box) != frozen_at, timeout=0.2)
    assert runtime.alive(box.identity)

    runtime.thaw(box.spec, box.identity)
    assert not _frozen_by_kernel(runtime, cgroups, box)
    assert _poll(lambda: (_counter(box) or 0) > frozen_at)


def test_signal_entered_kills_the_command_inside_and_nsenter_follows(
    sandboxes: Callable[..., Box], runtime: BubblewrapRuntime
) -> None:
    box = sandboxes()
    proc = box.spawn("sleep 1000 & exec sleep 1001")
    assert _poll(lambda: box.ok("ps -eo args=").count("sleep 100") == 2)
    runtime.signal_entered(proc.pid, signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL  # nsenter reports its child's death
    assert _poll(lambda: box.ok("ps -eo args=").count("sleep 100") == 0)


def test_destroy_kills_everything_and_removes_home_cgroups_and_files(
    sandboxes: Callable[..., Box], runtime: BubblewrapRuntime, cgroups: Cgroups
) -> None:
    box = sandboxes()
    stray = box.spawn("sleep 1000 & sleep 1000")
    command = box.command("/bin/sh", "-c", "touch /home/user/ran")
    box.ok("touch /home/user/file")
    dirs = cgroups.dirs(box.spec.id)
    assert all(d.is_dir() for d in dirs)

    runtime.destroy(box.spec, box.identity)
    assert not runtime.alive(box.identity)
    assert stray.wait(10) != 0
    assert not procfs.pids_of_uid(box.spec.uid)
    assert not box.spec.home.exists()
    assert not list(box.spec.home.parent.glob(f"{box.spec.home.name}.*"))
    assert not any(d.exists() for d in dirs)
    # idempotent, with and without the identity
    runtime.destroy(box.spec, box.identity)
    runtime.destroy(box.spec, None)
    # an enter command built before the destroy refuses to run afterwards
    late = entering.run(command)
    assert late.returncode == 125
    with pytest.raises(RuntimeFailure):
        runtime.enter(box.spec, box.identity, Command(["true"]))


def test_cgroups_hold_every_process_and_the_limits(
    sandboxes: Callable[..., Box], runtime: BubblewrapRuntime, cgroups: Cgroups
) -> None:
    assert runtime.limits_mode == "cgroup-v1"  # this host; other hosts may differ
    box = sandboxes()
    proc = box.spawn("exec sleep 1000")
    ns = box.identity.pid_namespace
    assert _poll(lambda: len(procfs.pids_in_pid_namespace(ns)) == 3)  # init, sleep, sleep
    launcher = _stat(box.identity.pid).ppid
    expected = {*procfs.pids_in_pid_namespace(ns), launcher, proc.pid}  # proc: nsenter
    for d in cgroups.dirs(box.spec.id):
        assert {int(p) for p in (d / "cgroup.procs").read_text().split()} == expected
    memory = cgroups.path("memory", box.spec.id)
    assert int((memory / "memory.limit_in_bytes").read_text()) == SMALL.memory_bytes
    pids = cgroups.path("pids", box.spec.id) / "pids.max"
    assert int(pids.read_text()) == SMALL.max_processes
    if "cpu" in cgroups.controllers:
        cpu = cgroups.path("cpu", box.spec.id)
        period = int((cpu / "cpu.cfs_period_us").read_text())
        assert int((cpu / "cpu.cfs_quota_us").read_text()) == SMALL.cpu_count * period


def test_alive_is_false_for_a_recycled_pid(
    sandboxes: Callable[..., Box], runtime: BubblewrapRuntime
) -> None:
    box = sandboxes()
    ident = box.identity
    assert runtime.alive(ident)
    for impostor in (
        Identity(ident.pid, ident.start_time + 1, ident.pid_namespace),
        Identity(ident.pid, ident.start_time, ident.pid_namespace + 1),
    ):
        assert not runtime.alive(impostor)
        with pytest.raises(RuntimeFailure):
            runtime.enter(box.spec, impostor, Command(["true"]))
        with pytest.raises(RuntimeFailure):
            runtime.host_path(box.spec, impostor, "/home/user")
    assert runtime.alive(ident)  # nothing above touched the real one


_LAUNCHER = """
import json, signal, sys
from pathlib import Path
from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime
from sandboxctl.sandboxd.cgroups import Cgroups
from sandboxctl.sandboxd.runtime import SIZE_LIMITS, SandboxSpec, Size
a = json.loads(sys.argv[1])
spec = SandboxSpec(id=a["id"], uid=a["uid"], root=Path("/"), home=Path(a["home"]),
                   limits=SIZE_LIMITS[Size.SMALL])
ident = BubblewrapRuntime(cgroups=Cgroups(parent=a["parent"])).start(spec)
print(json.dumps([ident.pid, ident.start_time, ident.pid_namespace]), flush=True)
signal.pause()  # the launcher lives until the test kills it
"""
PR_SET_CHILD_SUBREAPER = 36


def test_a_sandbox_survives_its_launcher_being_killed(
    runtime: BubblewrapRuntime, homes: Path
) -> None:
    uid = _free_uid()
    spec = SandboxSpec(
        id=f"rt{os.getpid()}-{uid}",
        uid=uid,
        root=Path("/"),
        home=homes / f"rt{os.getpid()}-{uid}",
        limits=SMALL,
    )
    args = {"id": spec.id, "uid": uid, "home": str(spec.home), "parent": CGROUP_PARENT}
    # Adopt the orphaned outer bwrap so this test can reap it (this host's pid 1 may not).
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    identity: Identity | None = None
    try:
        with subprocess.Popen(
            [sys.executable, "-c", _LAUNCHER, json.dumps(args)],
            stdout=subprocess.PIPE,
            text=True,
        ) as launcher:
            assert launcher.stdout is not None
            identity = Identity(*json.loads(launcher.stdout.readline()))
            launcher.kill()
            launcher.wait(10)
        assert runtime.alive(identity)
        outer = _stat(identity.pid).ppid
        box = Box(runtime, spec, identity)
        assert box.ok("id -u") == f"{uid}\n"
        runtime.destroy(spec, identity)
        assert not runtime.alive(identity)
        assert not spec.home.exists()
        os.waitpid(outer, 0)  # it reaped the sandbox's init and exited
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        runtime.destroy(spec, identity)


def test_host_path_maps_into_the_sandbox_and_refuses_escapes(
    sandboxes: Callable[..., Box], runtime: BubblewrapRuntime
) -> None:
    box = sandboxes()
    box.ok("echo hi > /home/user/f; echo tmp > /tmp/t")
    path = runtime.host_path(box.spec, box.identity, "/home/user/./sub/../f")
    assert path == Path(f"/proc/{box.identity.pid}/root/home/user/f")
    assert path.read_text() == "hi\n"
    assert runtime.host_path(box.spec, box.identity, "/tmp/t").read_text() == "tmp\n"
    for bad in ("/../etc/shadow", "/home/../../etc", "relative/path", "/tmp/\0x"):
        with pytest.raises(RuntimeFailure):
            runtime.host_path(box.spec, box.identity, bad)


# --- bubblewrap: limits ------------------------------------------------------------------


def test_memory_limit_stops_a_hog(sandboxes: Callable[..., Box]) -> None:
    box = sandboxes()  # small: 512 MiB
    assert box.run("python3", "-c", "b = bytearray(64 << 20)").returncode == 0
    hog = box.run("python3", "-c", "b = bytearray(900 << 20)")
    assert hog.returncode != 0


_FORK_BOMBLET = """
import os, signal
kids = []
try:
    for _ in range(64):
        pid = os.fork()
        if pid == 0:
            signal.pause()
            os._exit(0)
        kids.append(pid)
    print("unlimited", len(kids))
except OSError as exc:
    print("refused", len(kids), exc.errno)
finally:
    for pid in kids:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
"""


def test_pids_limit_refuses_forks_beyond_max(sandboxes: Callable[..., Box]) -> None:
    box = sandboxes(
        limits=Limits(
            cpu_count=1,
            memory_bytes=256 << 20,
            max_processes=16,
            tmp_bytes=1 << 20,
            home_bytes=1 << 20,
            open_files=64,
        )
    )
    outcome, forked, *_ = box.ok(f"python3 -c '{_FORK_BOMBLET}'").split()
    assert outcome == "refused"
    assert 0 < int(forked) < 16


def test_rlimit_mode_limits_freezes_and_destroys(
    homes: Path, sandboxes: Callable[..., Box]
) -> None:
    rt = BubblewrapRuntime(use_cgroups=False)
    assert rt.limits_mode == "rlimit"
    assert rt.freeze_mode == "signals"
    box = sandboxes(runtime=rt)
    assert box.ok("id -u") == f"{box.spec.uid}\n"
    assert box.run("python3", "-c", "b = bytearray(900 << 20)").returncode != 0
    box.spawn("while :; do :; done")
    ns = box.identity.pid_namespace
    assert _poll(lambda: len(procfs.pids_in_pid_namespace(ns)) >= 3)

    rt.freeze(box.spec, box.identity)
    states = {_stat(pid).state for pid in procfs.pids_in_pid_namespace(ns)}
    assert states == {"T"}
    rt.thaw(box.spec, box.identity)
    assert _poll(lambda: "T" not in {_stat(p).state for p in procfs.pids_in_pid_namespace(ns)})

    rt.destroy(box.spec, box.identity)
    assert not rt.alive(box.identity)
    assert not procfs.pids_of_uid(box.spec.uid)
    assert not box.spec.home.exists()


def test_a_failed_start_says_why_and_leaves_nothing_behind(
    runtime: BubblewrapRuntime, homes: Path, cgroups: Cgroups
) -> None:
    root = homes / f"empty-root-{os.getpid()}"
    for sub in ("proc", "dev", "tmp", "home", "etc"):
        (root / sub).mkdir(parents=True)
    for name in ("passwd", "group"):
        (root / "etc" / name).write_text("")
    uid = _free_uid()
    spec = SandboxSpec(
        id=f"rt{os.getpid()}-{uid}",
        uid=uid,
        root=root,
        home=homes / f"rt{os.getpid()}-{uid}",
        limits=SMALL,
    )
    with pytest.raises(RuntimeFailure, match=r"did not start.*/bin/sh"):
        runtime.start(spec)
    assert not spec.home.exists()
    assert not any(d.exists() for d in cgroups.dirs(spec.id))
    assert not procfs.pids_of_uid(uid)


# --- unsafe-process ----------------------------------------------------------------------


def test_unsafe_runtime_runs_as_the_uid_in_its_home(sandboxes: Callable[..., Box]) -> None:
    rt = UnsafeProcessRuntime()
    assert rt.isolated is False
    box = sandboxes(runtime=rt)
    uid = box.spec.uid
    assert procfs.read_stat(box.identity.pid) is not None
    assert _uid_of(box.identity.pid) == uid
    home = str(box.spec.home)
    assert box.ok("id -u; pwd; echo $HOME").split() == [str(uid), home, home]
    box.ok("echo x > $TMPDIR/t; echo y > ~/h")
    assert rt.host_path(box.spec, box.identity, "/tmp/t").read_text() == "x\n"
    assert rt.host_path(box.spec, box.identity, "/home/user/h").read_text() == "y\n"
    assert rt.host_path(box.spec, box.identity, "/etc/hostname") == Path("/etc/hostname")

    rt.freeze(box.spec, box.identity)
    assert _stat(box.identity.pid).state == "T"
    rt.thaw(box.spec, box.identity)
    assert _poll(lambda: _stat(box.identity.pid).state != "T")

    rt.destroy(box.spec, box.identity)
    assert not rt.alive(box.identity)
    assert not box.spec.home.exists()
    assert not procfs.pids_of_uid(uid)


def test_a_namespace_is_pinned_only_for_the_sandbox_it_names(
    sandboxes: Callable[..., Box],
) -> None:
    from sandboxctl.sandboxd.bubblewrap import PinnedNamespaces

    box = sandboxes()
    pinned = PinnedNamespaces()
    path = pinned.path(box.spec.id, box.identity)
    assert os.stat(path).st_ino == box.identity.pid_namespace
    gone = Identity(2**22 + 7, 1, box.identity.pid_namespace)  # no such pid
    with pytest.raises(RuntimeFailure):
        pinned.path("sb_gone", gone)
    impostor = Identity(box.identity.pid, box.identity.start_time, box.identity.pid_namespace + 1)
    with pytest.raises(RuntimeFailure):
        pinned.path("sb_impostor", impostor)
    pinned.release(box.spec.id)
    # Closed: its number may already name another open file, never that namespace.
    assert not os.path.exists(path) or os.stat(path).st_ino != box.identity.pid_namespace

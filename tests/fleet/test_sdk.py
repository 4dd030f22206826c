"""The unmodified e2b SDK (2.63.0) through ``sandboxctl serve``, a real process: the SDK
configured by the fleet's ``e2b.env`` alone, its envd calls through the envd proxy to the
host agent's envd, on real bubblewrap sandboxes."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from e2b import CommandExitException, FileType, Sandbox, TimeoutException
from e2b.exceptions import FileNotFoundException, InvalidArgumentException

from tests.conftest import process_slot
from tests.fleet.fleet import free_ports, start_fleet, stop_fleets
from tests.proxy.sdk_stack import create_sandbox
from tests.sandboxd.servers import sandboxes_unavailable, wait_until

pytestmark = pytest.mark.skipif(
    sandboxes_unavailable() is not None, reason=str(sandboxes_unavailable())
)

UID_BASE = 2_600_000 + process_slot() * 20  # clear of the uid_base fixture's blocks

T = TypeVar("T")


def read_until(read: Callable[[], T], done: Callable[[T], bool], what: str) -> T:
    """Read until ``done`` holds of the reading (``wait_until``'s deadline); a timeout
    shows the last reading, the state the test waited on and never saw."""
    last: list[T] = []

    def check() -> bool:
        last[:] = [read()]
        return done(last[0])

    try:
        wait_until(check, what=what)
    except AssertionError as error:
        raise AssertionError(f"{error}; last read: {last[0]!r}") from None
    return last[0]


def foreground_jobs(sbx: Sandbox) -> set[str]:
    """The command lines of the processes in the foreground of a terminal (``+`` in ps's
    state) in ``sbx``."""
    rows = (
        line.split(None, 1) for line in sbx.commands.run("ps -e -o stat=,args=").stdout.splitlines()
    )
    return {row[1].strip() for row in rows if len(row) == 2 and "+" in row[0]}


@pytest.fixture(scope="module")
def sdk() -> Iterator[dict[str, Any]]:
    state = Path(tempfile.mkdtemp(prefix="sandboxctl-serve-sdk-", dir="/tmp"))
    state.chmod(0o711)
    fleet = start_fleet(state / "fleet", free_ports(), UID_BASE, pool="default=2")
    try:
        env = fleet.e2b_env
        yield {
            "api_key": env["E2B_API_KEY"],
            "api_url": env["E2B_API_URL"],
            "sandbox_url": env["E2B_SANDBOX_URL"],
        }
    finally:
        stop_fleets([fleet])
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def sbx(sdk: dict[str, Any]) -> Iterator[Sandbox]:
    sandbox = create_sandbox(sdk)
    yield sandbox
    sandbox.kill()


def test_run(sbx: Sandbox) -> None:
    result = sbx.commands.run("echo hi; echo oops >&2")
    assert (result.stdout, result.stderr, result.exit_code) == ("hi\n", "oops\n", 0)
    assert sbx.is_running()


def test_non_zero_exit_raises(sbx: Sandbox) -> None:
    with pytest.raises(CommandExitException) as raised:
        sbx.commands.run("echo partial; exit 7")
    assert raised.value.exit_code == 7
    assert raised.value.stdout == "partial\n"


def test_envs_and_cwd(sbx: Sandbox) -> None:
    result = sbx.commands.run('echo "$FOO"; pwd', envs={"FOO": "bar"}, cwd="/tmp")
    assert result.stdout == "bar\n/tmp\n"


def test_background_list_and_kill(sbx: Sandbox) -> None:
    handle = sbx.commands.run("sleep 120", background=True)
    assert handle.pid in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException):
        handle.wait()
    assert handle.pid not in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.kill(handle.pid) is False


def test_stdin(sbx: Sandbox) -> None:
    handle = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.send_stdin(handle.pid, "through stdin\n")
    sbx.commands.close_stdin(handle.pid)
    assert handle.wait().stdout == "through stdin\n"


def test_timeout(sbx: Sandbox) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 30", timeout=1)
    assert time.monotonic() - started < 10
    wait_until(lambda: sbx.commands.list() == [], timeout=5, what="the command to be killed")


def test_files(sbx: Sandbox) -> None:
    info = sbx.files.write("/home/user/t.txt", "hello file")
    assert (info.name, info.path) == ("t.txt", "/home/user/t.txt")
    assert sbx.files.read("/home/user/t.txt") == "hello file"
    assert bytes(sbx.files.read("t.txt", format="bytes")) == b"hello file"
    written = sbx.files.write_files(
        [{"path": "/home/user/w/a.txt", "data": "A"}, {"path": "/home/user/w/b.txt", "data": b"B"}]
    )
    assert [w.path for w in written] == ["/home/user/w/a.txt", "/home/user/w/b.txt"]
    entries = sbx.files.list("/home/user/w")
    assert [(e.name, e.type, e.size) for e in entries] == [
        ("a.txt", FileType.FILE, 1),
        ("b.txt", FileType.FILE, 1),
    ]
    assert sbx.files.exists("/home/user/w/a.txt")
    assert not sbx.files.exists("/home/user/nope")
    assert sbx.files.make_dir("/home/user/w/d") is True
    assert sbx.files.make_dir("/home/user/w/d") is False
    assert sbx.files.get_info("/home/user/w/d").type == FileType.DIR
    moved = sbx.files.rename("/home/user/w/a.txt", "/home/user/w/d/c.txt")
    assert moved.path == "/home/user/w/d/c.txt"
    assert sbx.files.read("/home/user/w/d/c.txt") == "A"
    sbx.files.remove("/home/user/w")
    assert not sbx.files.exists("/home/user/w")
    with pytest.raises(FileNotFoundException):
        sbx.files.read("/home/user/w/d/c.txt")
    with pytest.raises(InvalidArgumentException):
        sbx.files.read("/../../etc/passwd")


def test_large_round_trip(sbx: Sandbox) -> None:
    data = os.urandom(50 << 20)
    sbx.files.write("/home/user/big.bin", data)
    read = sbx.files.read("/home/user/big.bin", format="bytes")
    assert hashlib.sha256(read).hexdigest() == hashlib.sha256(data).hexdigest()
    sbx.files.remove("/home/user/big.bin")


def test_connect_to_a_running_command(sbx: Sandbox) -> None:
    handle = sbx.commands.run("sleep 1; echo after", background=True)
    again = sbx.commands.connect(handle.pid)
    assert again.wait().stdout == "after\n"
    handle.wait()


def test_watch_dir(sbx: Sandbox) -> None:
    sbx.files.make_dir("/home/user/watched")
    watcher = sbx.files.watch_dir("/home/user/watched")
    try:
        sbx.files.write("/home/user/watched/new.txt", "x")
        sbx.commands.run("mv /home/user/watched/new.txt /home/user/watched/moved.txt")
        events: list[tuple[str, str]] = []

        def seen() -> bool:
            events.extend((e.name, e.type.value) for e in watcher.get_new_events())
            return ("moved.txt", "create") in events

        wait_until(seen, timeout=10, what="watch events")
        assert ("new.txt", "create") in events
        assert ("new.txt", "rename") in events
    finally:
        watcher.stop()
    with pytest.raises(FileNotFoundException):
        sbx.files.watch_dir("/home/user/nope")


def test_a_sandbox_sees_only_its_own_processes_and_cannot_write_the_system(
    sdk: dict[str, Any], sbx: Sandbox
) -> None:
    other = create_sandbox(sdk)
    try:
        # A process with a name no sandbox runs otherwise (a sandbox's init may be sleep).
        other.commands.run(
            "cp /bin/sleep /tmp/othersleep && exec /tmp/othersleep 300", background=True
        )
        wait_until(
            lambda: "othersleep" in other.commands.run("ps -e -o comm=").stdout,
            what="the other sandbox's process",
        )
        ps = sbx.commands.run("ps -e -o user=,comm=")
        lines = [line.split() for line in ps.stdout.splitlines()]
        assert lines, ps.stdout
        assert {user for user, _ in lines} == {"user"}  # no host or other sandbox process
        assert "othersleep" not in {comm for _, comm in lines}
        with pytest.raises(CommandExitException) as refused:
            sbx.commands.run("echo x > /usr/sandboxctl-sdk-test")
        assert "Read-only file system" in refused.value.stderr
        assert not os.path.exists("/usr/sandboxctl-sdk-test")
    finally:
        other.kill()


def test_a_commands_pid_is_its_pid_inside_the_sandbox(sbx: Sandbox) -> None:
    handle = sbx.commands.run("echo $$; sleep 30", background=True)
    try:
        # The pid shows sh, then bash, then sleep: bash execs its last command in place, a
        # moment after the start has been reported.
        read_until(
            lambda: sbx.commands.run(f"ps -o comm= -p {handle.pid}").stdout.split(),
            lambda comm: comm == ["sleep"],
            what=f"pid {handle.pid} to be the sleep bash exec'd in place",
        )
        assert handle.pid in [p.pid for p in sbx.commands.list()]
    finally:
        assert sbx.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException) as ended:
        handle.wait()
    assert ended.value.stdout == f"{handle.pid}\n"


def test_a_pty_runs_an_interactive_shell(sbx: Sandbox) -> None:
    from e2b.sandbox.commands.command_handle import PtySize

    handle = sbx.pty.create(PtySize(rows=24, cols=80))
    output = bytearray()
    ended: list[object] = []

    def read() -> None:
        try:
            ended.append(handle.wait(on_pty=output.extend))
        except Exception as error:  # the end, as the SDK reports it
            ended.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def shows(text: str) -> bool:
        return text.encode() in output

    def type_in(line: bytes) -> None:
        sbx.pty.send_stdin(handle.pid, line)

    # Each check looks for what only the command's output holds, not the echoed input.
    type_in(b"stty size; test -t 0 && test -t 1 && echo mark-$((6*7))\n")
    wait_until(lambda: shows("mark-42"), what="the shell to run a line on a terminal")
    assert shows("24 80")
    sbx.pty.resize(handle.pid, PtySize(rows=30, cols=100))
    type_in(b"stty size\n")
    wait_until(lambda: shows("30 100"), what="the new size")
    # Ctrl-C reaches the foreground job: the pty is the shell's controlling terminal.
    type_in(b"sleep 60\n")
    # Ctrl-C before sleep holds the terminal would reach the shell instead, and the line
    # typed ahead would be flushed with it.
    read_until(
        lambda: foreground_jobs(sbx),
        lambda jobs: "sleep 60" in jobs,
        what="sleep to be the terminal's foreground job",
    )
    type_in(b"\x03")
    type_in(b"echo back-$((1+1))\n")
    wait_until(lambda: shows("back-2"), timeout=10, what="Ctrl-C to stop sleep")
    sbx.pty.stream_input(handle.pid, [b"echo via-", b"stream-$((2+3))\n"])
    wait_until(lambda: shows("via-stream-5"), what="input streamed to the pty")
    type_in(b"exit\n")
    reader.join(timeout=10)
    assert ended, "the pty did not end"
    assert handle.pid not in [p.pid for p in sbx.commands.list()]


def test_a_pty_is_killed_by_pid_and_by_its_timeout(sbx: Sandbox) -> None:
    from e2b.sandbox.commands.command_handle import PtySize

    killed = sbx.pty.create(PtySize(rows=24, cols=80), timeout=0)
    assert sbx.pty.kill(killed.pid) is True
    with pytest.raises(CommandExitException):
        killed.wait()
    started = time.monotonic()
    timed = sbx.pty.create(PtySize(rows=24, cols=80), timeout=1)
    with pytest.raises(TimeoutException):
        timed.wait()
    assert time.monotonic() - started < 10
    wait_until(
        lambda: not {killed.pid, timed.pid} & {p.pid for p in sbx.commands.list()},
        timeout=5,
        what="both ptys to be gone",
    )


def test_stream_input_feeds_a_commands_stdin(sbx: Sandbox) -> None:
    handle = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.stream_input(handle.pid, ["line one\n", b"line two\n"])
    sbx.commands.stream_input(handle.pid, (f"line {n}\n" for n in ("three", "four")))
    sbx.commands.close_stdin(handle.pid)
    assert handle.wait().stdout == "line one\nline two\nline three\nline four\n"


def test_a_user_other_than_the_sandboxs_is_refused(sbx: Sandbox) -> None:
    assert sbx.commands.run("id -un", user="user").stdout == "user\n"
    with pytest.raises(InvalidArgumentException, match="user 'root' is not available"):
        sbx.commands.run("id -un", user="root")
    sbx.files.write("/home/user/owned.txt", "mine", user="user")
    with pytest.raises(InvalidArgumentException, match="user 'root' is not available"):
        sbx.files.read("/home/user/owned.txt", user="root")
    with pytest.raises(InvalidArgumentException, match="user 'root' is not available"):
        sbx.files.list("/home/user", user="root")

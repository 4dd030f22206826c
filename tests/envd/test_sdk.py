"""The unmodified e2b SDK (2.63.0) against envd, through a test-only forwarding shim."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator

import pytest
from e2b import CommandExitException, FileType, Sandbox, TimeoutException
from e2b.exceptions import FileNotFoundException, InvalidArgumentException

from tests.envd.conftest import Host
from tests.envd.shim import Shim, shim_serving
from tests.sandboxd.servers import wait_until

API_KEY = "e2b_" + "0" * 40


@pytest.fixture(scope="module")
def shim(host: Host) -> Iterator[tuple[Shim, str]]:
    shim = Shim(host.address)
    with shim_serving(shim) as url:
        yield shim, url


@pytest.fixture(scope="module")
def sbx(host: Host, shim: tuple[Shim, str]) -> Sandbox:
    bridge, url = shim
    envd = host.claim()
    bridge.tokens[envd.sandbox_id] = envd.token
    return Sandbox.connect(envd.sandbox_id, api_key=API_KEY, api_url=url, sandbox_url=url)


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

"""envd over real HTTP, with requests shaped exactly like the e2b SDK's."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time

import httpx

from sandboxctl.envd import ENVD_VERSION
from tests.envd.conftest import ROOT, Host
from tests.envd.wire import STREAM, Envd, chunked, envelope, stream_error
from tests.sandboxd.servers import wait_until


def test_version_is_semver() -> None:
    major, minor, patch = (int(part) for part in ENVD_VERSION.split("."))
    assert (major, minor, patch) >= (0, 5, 7)


def test_health_and_auth(shared: Envd, host: Host) -> None:
    assert httpx.get(f"{shared.base}/health", headers=shared.headers()).status_code == 204
    root = {"authorization": f"Bearer {ROOT}"}
    assert httpx.get(f"{shared.base}/health", headers=root).status_code == 204
    for headers in ({}, {"authorization": "Bearer wrong"}, {"x-access-token": shared.token}):
        response = httpx.get(f"{shared.base}/health", headers=headers)
        assert response.status_code == 401
        assert response.json()["code"] == 401
    other = host.claim()
    try:  # another sandbox's token does not open this one
        response = httpx.post(
            f"{shared.base}/process.Process/List",
            json={},
            headers={"authorization": f"Bearer {other.token}"},
        )
        assert response.status_code == 401
        assert response.json()["code"] == "unauthenticated"
        # a streaming call is refused in its end-of-stream envelope, under HTTP 200
        start = httpx.post(
            f"{shared.base}/process.Process/Start",
            content=envelope({"process": {"cmd": "/bin/true"}}),
            headers={"authorization": f"Bearer {other.token}", "content-type": STREAM},
        )
        assert stream_error(start)["code"] == "unauthenticated"
    finally:
        host.agent.release(other.sandbox_id)


def test_unknown_sandbox_is_not_running(host: Host) -> None:
    response = httpx.get(
        f"http://{host.address}/v1/sandboxes/nope/envd/health",
        headers={"authorization": f"Bearer {ROOT}"},
    )
    assert response.status_code == 502
    assert "was not found" in response.json()["message"]


def test_run_stdout_stderr_exit(shared: Envd) -> None:
    result = shared.run("echo hi; echo err >&2")
    assert (result["stdout"], result["stderr"]) == ("hi\n", "err\n")
    assert result["end"] == {"exited": True, "status": "exit status 0"}
    flags = [flags for flags, _ in result["events"]]
    assert flags[-1] == 2
    assert set(flags[:-1]) == {0}
    assert result["events"][-1][1] == {}
    failed = shared.run("exit 3")
    assert failed["end"]["exitCode"] == 3
    assert failed["end"]["status"] == "exit status 3"


def test_run_envs_and_cwd(shared: Envd) -> None:
    result = shared.run('echo "$A-$B"; pwd; id -un', envs={"A": "1", "B": "two"}, cwd="/tmp")
    assert result["stdout"] == "1-two\n/tmp\nuser\n"
    assert shared.run("pwd")["stdout"] == "/home/user\n"
    missing = shared.run("pwd", cwd="/nowhere")
    assert missing["end"]["exitCode"] != 0


def test_the_sandbox_env_reaches_commands_under_the_requests(host: Host) -> None:
    env = {"FOO": "bar", "ONLY": "from the claim", "LANG": "C"}
    envd = host.claim(env=env)
    try:
        shown = 'echo "$FOO|$ONLY|$LANG|$HOME"'
        assert envd.run(shown)["stdout"] == "bar|from the claim|C|/home/user\n"
        overridden = envd.run(shown, envs={"FOO": "baz", "LANG": "C.UTF-8"})
        assert overridden["stdout"] == "baz|from the claim|C.UTF-8|/home/user\n"
    finally:
        host.agent.release(envd.sandbox_id)
    plain = host.claim()
    try:
        assert plain.run('echo "$FOO|$ONLY"')["stdout"] == "|\n"
    finally:
        host.agent.release(plain.sandbox_id)


def test_start_bad_requests(shared: Envd) -> None:
    response, _ = shared.stream("process.Process/Start", {"process": {}})
    assert stream_error(response) == {
        "code": "invalid_argument",
        "message": "process.cmd is required",
    }
    response = httpx.post(
        f"{shared.base}/process.Process/Start",
        content=b"\x00\x00",
        headers=shared.headers(**{"content-type": STREAM}),
    )
    assert stream_error(response)["code"] == "invalid_argument"
    basic_root = {"x-forwarded-authorization": "Basic cm9vdDo="}  # the SDK's user="root"
    response = httpx.post(
        f"{shared.base}/process.Process/Start",
        content=envelope({"process": {"cmd": "/bin/true"}}),
        headers=shared.headers(**{"content-type": STREAM}, **basic_root),
    )
    assert stream_error(response)["code"] == "invalid_argument"
    response = httpx.post(
        f"{shared.base}/process.Process/List",
        json={},
        headers=shared.headers(**basic_root),
    )
    assert response.status_code == 400  # a unary call keeps its HTTP status
    assert response.json()["code"] == "invalid_argument"


def test_deadline_kills_the_command(shared: Envd) -> None:
    started = time.monotonic()
    _response, events = shared.stream(
        "process.Process/Start",
        {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo go; sleep 30"]}},
        timeout_ms=1500,
    )
    assert time.monotonic() - started < 10
    assert events[0][1]["event"]["start"]["pid"] > 0
    assert events[-1] == (
        2,
        {"error": {"code": "deadline_exceeded", "message": "the command timed out"}},
    )
    pid = events[0][1]["event"]["start"]["pid"]
    listed = shared.rpc("process.Process/List", {}).json()
    assert pid not in [p["pid"] for p in listed.get("processes", [])]


def test_background_list_connect_kill(shared: Envd) -> None:
    command = shared.background(
        "process.Process/Start",
        {
            "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo up; sleep 60"]},
            "tag": "bg",
        },
    )
    listed = command.listed()
    pid = listed["pid"]
    assert listed["config"]["args"] == ["-l", "-c", "echo up; sleep 60"]
    assert listed["tag"] == "bg"
    killed = shared.rpc(
        "process.Process/SendSignal", {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}
    )
    assert killed.status_code == 200
    assert killed.json() == {}
    _, events = command.result()
    end = events[-2][1]["event"]["end"]
    assert end["exitCode"] == -1
    assert end["exited"] is False
    assert end["status"] == "signal: killed"
    gone = shared.rpc(
        "process.Process/SendSignal", {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}
    )
    assert gone.status_code == 404
    assert gone.json()["code"] == "not_found"
    connected, _ = shared.stream("process.Process/Connect", {"process": {"pid": pid}})
    assert stream_error(connected)["code"] == "not_found"


def test_the_start_pid_is_the_commands_own_and_a_kill_right_after_start_lands(
    shared: Envd,
) -> None:
    ran = shared.run("echo $$; sleep 0.3")
    assert ran["stdout"] == f"{ran['pid']}\n"  # the pid inside the sandbox, as $$ says

    # The SDK kills as soon as it has the start event: the command must be there by then.
    message = {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "sleep 60"]}}
    with shared.opened("process.Process/Start", message) as stream:
        pid = stream.next()[1]["event"]["start"]["pid"]
        killed = shared.rpc(
            "process.Process/SendSignal", {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}
        )
        assert killed.json() == {}
        rest = stream.rest()  # ends within the read timeout only if it was killed
    end = rest[-2][1]["event"]["end"]
    assert end["status"] == "signal: killed"


def test_pty_calls_refused(shared: Envd) -> None:
    def start(message: dict[str, object]) -> httpx.Response:
        return shared.stream("process.Process/Start", message)[0]

    bad = start({"process": {"cmd": "/bin/true"}, "pty": {"size": {"rows": 0, "cols": 80}}})
    assert stream_error(bad)["message"] == "pty.size.rows: expected 1..65535"

    plain = {"process": {"cmd": "/bin/sleep", "args": ["30"]}, "tag": "plain"}
    command = shared.background("process.Process/Start", plain)
    selector = {"tag": "plain"}
    try:
        command.listed()
        resize = {"process": selector, "pty": {"size": {"rows": 30, "cols": 100}}}
        typed = {"process": selector, "input": {"pty": "bHMK"}}
        for method, message in (("Update", resize), ("SendInput", typed)):
            refused = shared.rpc(f"process.Process/{method}", message)
            assert refused.status_code == 400, method
            assert refused.json() == {
                "code": "failed_precondition",
                "message": "the process has no pty",
            }
    finally:
        shared.rpc("process.Process/SendSignal", {"process": selector, "signal": "SIGNAL_SIGKILL"})
        command.result()


def test_stream_input_refusals(shared: Envd) -> None:
    def stream_input(*messages: dict[str, object]) -> httpx.Response:
        body = b"".join(envelope(m) for m in messages)
        headers = shared.headers(**{"content-type": STREAM})
        # Split mid-envelope: each message is taken once it is whole.
        return httpx.post(
            f"{shared.base}/process.Process/StreamInput",
            content=chunked(body, size=3),
            headers=headers,
            timeout=30,
        )

    data = {"data": {"input": {"stdin": "eA=="}}}
    no_start = stream_input(data)
    assert stream_error(no_start) == {
        "code": "invalid_argument",
        "message": "the input stream must start with start",
    }
    unknown = stream_input({"start": {"process": {"pid": 999999}}}, data)
    assert stream_error(unknown)["code"] == "not_found"
    empty = stream_input()
    assert stream_error(empty)["message"] == "the input stream named no process"


def test_stdin(shared: Envd) -> None:
    command = shared.background(
        "process.Process/Start",
        {
            "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "cat; echo done"]},
            "stdin": True,
        },
    )
    pid = command.listed()["pid"]
    data = base64.b64encode(b"hello stdin\n").decode()
    sent = shared.rpc(
        "process.Process/SendInput", {"process": {"pid": pid}, "input": {"stdin": data}}
    )
    assert sent.status_code == 200, sent.text
    assert shared.rpc("process.Process/CloseStdin", {"process": {"pid": pid}}).status_code == 200
    _, events = command.result()
    out = b"".join(
        base64.b64decode(m["event"]["data"]["stdout"])
        for _, m in events
        if "data" in m.get("event", {})
    )
    assert out == b"hello stdin\ndone\n"


def test_keepalive_on_quiet_commands(shared: Envd, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from sandboxctl.envd import process

    monkeypatch.setattr(process, "KEEPALIVE_SECONDS", 0.2)
    result = shared.run("sleep 1; echo late")
    kinds = [next(iter(m["event"])) for _, m in result["events"][:-1]]
    assert kinds[0] == "start"
    assert kinds[-1] == "end"
    assert "keepalive" in kinds
    assert result["stdout"] == "late\n"


def test_isolation(fresh: Envd) -> None:
    ps = fresh.run("ps -e -o user=,comm=")
    lines = [line.split() for line in ps["stdout"].splitlines()]
    assert {user for user, _ in lines} == {"user"}
    assert {comm for _, comm in lines} <= {"bwrap", "sh", "sleep", "bash", "ps"}
    write = fresh.run("echo x > /usr/envd-test")
    assert write["end"]["exitCode"] != 0
    assert not os.path.exists("/usr/envd-test")


def test_files_write_read(shared: Envd) -> None:
    # multipart, as files.write: one part, ?path= and the part's filename
    response = httpx.post(
        f"{shared.base}/files",
        params={"path": "/home/user/t.txt"},
        headers=shared.headers(),
        files={"file": ("/home/user/t.txt", b"hello file", "application/octet-stream")},
    )
    assert response.status_code == 200, response.text
    assert response.json() == [{"name": "t.txt", "type": "file", "path": "/home/user/t.txt"}]
    read = httpx.get(
        f"{shared.base}/files", params={"path": "/home/user/t.txt"}, headers=shared.headers()
    )
    assert read.status_code == 200
    assert read.content == b"hello file"
    assert shared.run("stat -c %U /home/user/t.txt")["stdout"] == "user\n"
    # write_files: two parts, no ?path=, filenames are the destinations (dirs made)
    response = httpx.post(
        f"{shared.base}/files",
        headers=shared.headers(),
        files=[
            ("file", ("/home/user/d/a.txt", b"A", "application/octet-stream")),
            ("file", ("b.txt", b"", "application/octet-stream")),
        ],
    )
    assert [entry["path"] for entry in response.json()] == [
        "/home/user/d/a.txt",
        "/home/user/b.txt",
    ]
    assert shared.run("cat d/a.txt; wc -c < b.txt")["stdout"] == "A0\n"
    # octet-stream, chunked
    response = httpx.post(
        f"{shared.base}/files",
        params={"path": "/tmp/o.bin"},
        headers=shared.headers(**{"content-type": "application/octet-stream"}),
        content=chunked(b"\x00\x01binary" * 100, 33),
    )
    assert response.status_code == 200
    assert response.json()[0]["path"] == "/tmp/o.bin"
    read = httpx.get(
        f"{shared.base}/files", params={"path": "/tmp/o.bin"}, headers=shared.headers()
    )
    assert read.content == b"\x00\x01binary" * 100


def test_files_errors(shared: Envd) -> None:
    missing = httpx.get(
        f"{shared.base}/files", params={"path": "/home/user/missing"}, headers=shared.headers()
    )
    assert missing.status_code == 404
    assert missing.json()["code"] == 404
    directory = httpx.get(
        f"{shared.base}/files", params={"path": "/home"}, headers=shared.headers()
    )
    assert directory.status_code == 400
    readonly = httpx.post(
        f"{shared.base}/files",
        params={"path": "/usr/x"},
        headers=shared.headers(),
        files={"file": ("/usr/x", b"x")},
    )
    assert readonly.status_code == 403
    assert not os.path.exists("/usr/x")
    escape = httpx.get(
        f"{shared.base}/files", params={"path": "/home/../../etc/passwd"}, headers=shared.headers()
    )
    assert escape.status_code == 400
    escape = shared.rpc("filesystem.Filesystem/Stat", {"path": "../../../x"})
    assert escape.status_code == 400
    assert escape.json()["code"] == "invalid_argument"


def test_symlinks_stay_inside(shared: Envd) -> None:
    # /etc/shadow on the host is root-only; the sandbox's uid cannot read it, and a
    # symlink to the sandbox's own view of a path is still the sandbox's view.
    shared.run("ln -sf /etc/shadow /home/user/shadow; ln -sfn / /home/user/root")
    read = httpx.get(
        f"{shared.base}/files", params={"path": "/home/user/shadow"}, headers=shared.headers()
    )
    assert read.status_code == 403
    write = httpx.post(
        f"{shared.base}/files",
        params={"path": "/home/user/root/etc/envd-test"},
        headers=shared.headers(),
        files={"file": ("x", b"x")},
    )
    assert write.status_code == 403
    assert not os.path.exists("/etc/envd-test")


def test_large_round_trip(shared: Envd) -> None:
    size = 50 << 20
    block = os.urandom(1 << 20)
    digest = hashlib.sha256(block * 50).hexdigest()
    response = httpx.post(
        f"{shared.base}/files",
        params={"path": "/home/user/big.bin"},
        headers=shared.headers(**{"content-type": "application/octet-stream"}),
        content=(block for _ in range(50)),
        timeout=120,
    )
    assert response.status_code == 200, response.text
    hashed = hashlib.sha256()
    total = 0
    with httpx.stream(
        "GET",
        f"{shared.base}/files",
        params={"path": "/home/user/big.bin"},
        headers=shared.headers(),
        timeout=120,
    ) as read:
        assert read.status_code == 200
        for chunk in read.iter_bytes():
            hashed.update(chunk)
            total += len(chunk)
    assert (total, hashed.hexdigest()) == (size, digest)
    assert shared.run("sha256sum big.bin; rm big.bin")["stdout"].split()[0] == digest


def test_filesystem_rpcs(shared: Envd) -> None:
    made = shared.rpc("filesystem.Filesystem/MakeDir", {"path": "/home/user/fs/sub"})
    assert made.status_code == 200, made.text
    entry = made.json()["entry"]
    assert (entry["name"], entry["type"], entry["path"]) == (
        "sub",
        "FILE_TYPE_DIRECTORY",
        "/home/user/fs/sub",
    )
    again = shared.rpc("filesystem.Filesystem/MakeDir", {"path": "/home/user/fs/sub"})
    assert again.status_code == 409
    assert again.json()["code"] == "already_exists"
    shared.run("printf 0123456789 > fs/f.txt; printf x > fs/sub/g")
    stat = shared.rpc("filesystem.Filesystem/Stat", {"path": "/home/user/fs/f.txt"}).json()["entry"]
    assert stat["size"] == "10"
    assert stat["type"] == "FILE_TYPE_FILE"
    assert stat["owner"] == "user"
    assert stat["permissions"].startswith("-rw")
    assert stat["modifiedTime"].endswith("Z")
    assert isinstance(stat["mode"], int)
    listed = shared.rpc("filesystem.Filesystem/ListDir", {"path": "/home/user/fs", "depth": 1})
    assert [e["name"] for e in listed.json()["entries"]] == ["f.txt", "sub"]
    deep = shared.rpc("filesystem.Filesystem/ListDir", {"path": "/home/user/fs", "depth": 2})
    assert [e["path"] for e in deep.json()["entries"]] == [
        "/home/user/fs/f.txt",
        "/home/user/fs/sub",
        "/home/user/fs/sub/g",
    ]
    moved = shared.rpc(
        "filesystem.Filesystem/Move",
        {"source": "/home/user/fs/f.txt", "destination": "/home/user/fs/h.txt"},
    )
    assert moved.json()["entry"]["path"] == "/home/user/fs/h.txt"
    assert shared.rpc("filesystem.Filesystem/Remove", {"path": "/home/user/fs"}).json() == {}
    missing = shared.rpc("filesystem.Filesystem/Stat", {"path": "/home/user/fs"})
    assert missing.status_code == 404
    assert missing.json()["code"] == "not_found"
    usr = shared.rpc("filesystem.Filesystem/MakeDir", {"path": "/usr/envd-test"})
    assert usr.json()["code"] == "permission_denied"
    unary_json = json.loads(shared.rpc("process.Process/List", {}).text)
    assert "processes" in unary_json


def test_watch_dir_stream(shared: Envd) -> None:
    shared.run("mkdir -p /home/user/ws")
    watched = {"path": "/home/user/ws"}
    with shared.opened("filesystem.Filesystem/WatchDir", watched, timeout_ms=2500) as stream:
        assert stream.response.headers["content-type"] == STREAM
        assert stream.next() == (0, {"start": {}})  # sent once the watch is in place
        shared.run("touch /home/user/ws/a")
        events = stream.rest()
    assert (0, {"filesystem": {"name": "a", "type": "EVENT_TYPE_CREATE"}}) in events
    assert events[-1][0] == 2
    assert events[-1][1]["error"]["code"] == "deadline_exceeded"
    missing, _ = shared.stream("filesystem.Filesystem/WatchDir", {"path": "/home/user/none"})
    assert stream_error(missing)["code"] == "not_found"


def test_unimplemented_and_bad_codec(shared: Envd) -> None:
    unknown = shared.rpc("process.Process/Nope", {})
    assert unknown.status_code == 501
    proto = httpx.post(
        f"{shared.base}/process.Process/List",
        content=b"",
        headers=shared.headers(**{"content-type": "application/proto"}),
    )
    assert proto.status_code == 415


def test_commands_are_logged_with_their_exit_code(host: Host) -> None:
    envd = host.claim()
    try:
        ran = envd.run("exit 3")
        pid = ran["pid"]
        found = host.agent.events.events(envd.sandbox_id)
        assert found is not None
        messages = [event.message for event in found[1]]
        assert f"process {pid} started: /bin/bash -l -c 'exit 3'" in messages
        exited = [e for e in found[1] if e.message.startswith(f"process {pid} exited")]
        assert exited[0].message == f"process {pid} exited with code 3 (exit status 3)"
        assert exited[0].level == "warn"
        assert exited[0].fields["exitCode"] == "3"
    finally:
        host.agent.release(envd.sandbox_id)


def test_a_sandbox_has_at_most_max_terminals_ptys_of_the_host(fresh: Envd) -> None:
    """envd's ptys are the host's, shared by every sandbox: one sandbox cannot take them
    all; a pty closed gives its place back."""
    from sandboxctl.envd.process import MAX_TERMINALS

    sleeping = {"process": {"cmd": "/bin/sleep", "args": ["60"]}, "pty": {}}
    held = [fresh.background("process.Process/Start", sleeping) for _ in range(MAX_TERMINALS)]

    def listed() -> list[dict[str, object]]:
        return list(fresh.rpc("process.Process/List", {}).json()["processes"])

    wait_until(lambda: len(listed()) == MAX_TERMINALS, what="every pty command to run")
    refused, _ = fresh.stream("process.Process/Start", sleeping)
    assert stream_error(refused) == {
        "code": "resource_exhausted",
        "message": f"a sandbox may have at most {MAX_TERMINALS} ptys open",
    }
    killed = {"process": {"pid": listed()[0]["pid"]}, "signal": "SIGNAL_SIGKILL"}
    fresh.rpc("process.Process/SendSignal", killed)
    wait_until(lambda: len(listed()) < MAX_TERMINALS, what="the killed one to end")
    quick = {"process": {"cmd": "/bin/true"}, "pty": {}}
    _, events = fresh.stream("process.Process/Start", quick)
    assert "start" in events[0][1]["event"]  # its place was given back
    assert len(held) == MAX_TERMINALS  # their streams end with the sandbox

"""The client matrix's scenario for the Python SDK, run as a script by each SDK's own
interpreter (the pinned one in .venv, the newest 2.x in the client cache), configured by
the environment alone (E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL). Prints one JSON object
of what it saw; the test asserts on it. Uses the SDK and the standard library only."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from importlib.metadata import version
from typing import Any

from e2b import PtySize, Sandbox, SandboxQuery
from e2b.exceptions import FileNotFoundException, InvalidArgumentException


def until(read: Any, ok: Any, seconds: float = 20.0) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = read()
        if ok(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def api(path: str) -> Any:
    request = urllib.request.Request(
        os.environ["E2B_API_URL"] + path, headers={"X-API-Key": os.environ["E2B_API_KEY"]}
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


def main() -> None:
    tag = sys.argv[1]
    seen: dict[str, Any] = {"version": version("e2b")}
    sandbox = Sandbox.create(metadata={"matrix": tag})
    try:
        seen["run"] = sandbox.commands.run("echo hi from $0").stdout
        sandbox.files.write("/home/user/notes/a.txt", "written")
        seen["files"] = sandbox.files.read("/home/user/notes/a.txt")
        try:
            sandbox.files.read("/home/user/none")
        except FileNotFoundException:
            seen["missing_file"] = "FileNotFoundException"
        watcher = sandbox.files.watch_dir("/home/user/notes")
        sandbox.files.write("/home/user/notes/b.txt", "b")
        events = until(watcher.get_new_events, bool)
        watcher.stop()
        seen["watch"] = sorted({(e.name, e.type.name) for e in events})
        output = bytearray()
        terminal = sandbox.pty.create(PtySize(rows=24, cols=80))
        sandbox.pty.send_stdin(terminal.pid, b"echo pty-$((6*7))\nexit\n")
        terminal.wait(on_pty=output.extend)
        seen["pty"] = "pty-42" in output.decode(errors="replace")
        try:
            sandbox.commands.run("id", user="root")
        except InvalidArgumentException:
            seen["root"] = "InvalidArgumentException"
        listed = Sandbox.list(query=SandboxQuery(metadata={"matrix": tag})).next_items()
        seen["list"] = [(s.sandbox_id == sandbox.sandbox_id, s.metadata) for s in listed]
        metrics = until(sandbox.get_metrics, bool)
        seen["metrics"] = {"cpu_count": metrics[-1].cpu_count, "mem_total": metrics[-1].mem_total}
        logs = api(f"/v2/sandboxes/{sandbox.sandbox_id}/logs")["logs"]
        seen["logs"] = [entry["message"] for entry in logs][:2]
        seen["templates"] = sorted(t["templateID"] for t in api("/templates"))
    finally:
        seen["kill"] = sandbox.kill()
    seen["running_after_kill"] = Sandbox.list(
        query=SandboxQuery(metadata={"matrix": tag})
    ).next_items()
    print(json.dumps(seen, default=str))  # noqa: T201 (the test reads this line)


if __name__ == "__main__":
    main()

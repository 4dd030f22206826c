"""Real agents for tests: in-process on a loopback port, or as a `sandboxctl` subprocess."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import httpx
import uvicorn

from sandboxctl.lanes.processes import free_port
from sandboxctl.lifecycle import Background
from sandboxctl.sandboxd.agent import AdoptionReport, Agent
from sandboxctl.sandboxd.api import create_app


def sandboxes_unavailable() -> str | None:
    """Why real sandboxes cannot run here (they need root and bubblewrap), or None."""
    if os.geteuid() != 0:
        return "real sandboxes run as root"
    missing = [tool for tool in ("bwrap", "setpriv", "nsenter") if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)} (make test installs bubblewrap)"
    return None


# How long a `sandboxctl` service process may take to answer: on a loaded 2-core machine
# its imports alone have taken over 20 s. A deadline, not a wait: a ready one ends it.
START_TIMEOUT = 60.0


def wait_until(check, timeout: float = 20.0, interval: float = 0.02, what: str = "condition"):  # type: ignore[no-untyped-def]
    """Poll ``check`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def start_agent(agent: Agent) -> AdoptionReport:
    """Start ``agent`` and run its loops on threads of their own, as serve-sandboxd runs
    them under its manager; ``agent.stop()`` ends them before it destroys anything."""
    report = agent.start()
    for loop in agent.loops():
        Background(loop).start()
    return report


@contextmanager
def serving(agent: Agent, token: str | None) -> Iterator[str]:
    """Serve ``agent`` on a free loopback port in this process; yields its address."""
    port = free_port()
    config = uvicorn.Config(
        create_app(agent, token),
        host="127.0.0.1",
        port=port,
        log_level="error",
        lifespan="off",
        loop="asyncio",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, what="the agent to listen")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def agent_process(
    args: list[str], address: str, output: IO[bytes] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `sandboxctl serve-sandboxd ARGS` until it answers; stop it at the end."""
    with service_process(
        ["serve-sandboxd", *args], f"http://{address}/healthz", output=output
    ) as process:
        yield process


@contextmanager
def service_process(
    arguments: list[str],
    ready_url: str,
    verify: bool | ssl.SSLContext = True,
    output: IO[bytes] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `sandboxctl ARGUMENTS` until ``ready_url`` answers below 400 (an HTTPS one
    trusted through ``verify``); SIGTERM it at the end unless the test has stopped it.

    Its output goes to ``output`` (default: a temporary file), not a pipe nobody drains,
    which could stall it.
    """
    command = [sys.executable, "-m", "sandboxctl", *arguments]
    with contextlib.ExitStack() as files:
        log = output or files.enter_context(tempfile.TemporaryFile())
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(
                lambda: (status_of(ready_url, verify) or 500) < 400 or process.poll() is not None,
                timeout=START_TIMEOUT,
                what=f"sandboxctl {arguments[0]} to answer",
            )
            if process.poll() is not None:
                said = ""
                if output is None:
                    log.seek(0)
                    said = log.read().decode(errors="replace")
                raise AssertionError(f"{arguments[0]} exited with {process.returncode}: {said}")
            yield process
        finally:
            _stop(process)


def status_of(url: str, verify: bool | ssl.SSLContext = True) -> int | None:
    """The status ``url`` answers with, or None when nothing answers."""
    try:
        return httpx.get(url, timeout=2, verify=verify).status_code
    except httpx.HTTPError:
        return None


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()


def write_token(path: Path, token: str) -> Path:
    path.write_text(token + "\n")
    return path

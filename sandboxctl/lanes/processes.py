"""A supervised child process of a kit: spawned (optionally inside a network namespace),
ready once a URL answers, stopped by signal, its output kept in a log file whose tail a
failure quotes."""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import httpx

from sandboxctl.lanes.model import LaneError

READY_TIMEOUT = 60.0  # seconds for a part to answer (the machine may be busy)
STOP_TIMEOUT = 20.0  # seconds a part may take to exit on SIGTERM before it is killed
TAIL = 2000  # characters of a log a failure quotes


class Process:
    """``python -m MODULE ARGS`` (``sandboxctl`` by default), or ``PROGRAM ARGS`` when a
    program is named, in network namespace ``netns`` when given, its stdout and stderr
    appended to ``LOGDIR/NAME.log`` (kept across restarts). Ready once ``ready_url``
    answers below 500, or once ``ready_check`` (for a part that wants TLS and a client
    certificate) says so."""

    def __init__(
        self,
        name: str,
        args: list[str],
        ready_url: str,
        logdir: Path,
        netns: str | None = None,
        module: str = "sandboxctl",
        program: Path | None = None,
        ready_check: Callable[[], bool] | None = None,
    ) -> None:
        self.name = name
        self.args = args
        self.ready_url = ready_url
        self.log = logdir / f"{name}.log"
        self.netns = netns
        self.module = module
        self.program = program
        self.ready_check = ready_check or partial(answers, ready_url)
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def command(self) -> list[str]:
        if self.program is not None:
            command = [str(self.program), *self.args]
        else:
            command = [sys.executable, "-m", self.module, *self.args]
        # ``ip netns exec`` execs the command: the pid we hold is the part's own.
        return ["ip", "netns", "exec", self.netns, *command] if self.netns else command

    def spawn(self) -> Process:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # Not in the terminal's process group: Ctrl-C reaches the runner alone,
                # which stops the parts in order (agents destroy their sandboxes).
                start_new_session=True,
            )
        return self

    def start(self) -> Process:
        return self.spawn().ready()

    def ready(self, timeout: float = READY_TIMEOUT) -> Process:
        """Wait until the ready URL answers below 500; one line naming the part and its
        log's tail if it exits or stays silent."""
        popen = self.popen
        if popen is None:
            raise LaneError(f"{self.name} was never started")
        deadline = time.monotonic() + timeout
        while popen.poll() is None:
            if self.ready_check():
                return self
            if time.monotonic() > deadline:
                raise LaneError(f"{self.name} did not answer within {timeout:.0f} s: {self.tail()}")
            time.sleep(0.1)
        raise LaneError(f"{self.name} exited with {popen.returncode}: {self.tail()}")

    def tail(self) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text[-TAIL:].strip().splitlines()[-8:])

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def send(self, sig: int) -> None:
        if self.running:
            assert self.popen is not None
            self.popen.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> None:
        """Signal the part and wait for it to exit (SIGKILL after ``timeout``)."""
        self.send(sig)
        self.wait(timeout)

    def wait(self, timeout: float = STOP_TIMEOUT) -> None:
        """Wait for a signalled part to exit, SIGKILL after ``timeout``. Never a second
        SIGTERM: a server takes that as "exit now", skipping its cleanup."""
        popen = self.popen
        if popen is not None:
            try:
                popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()
        self.popen = None

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


def answers(url: str, timeout: float = 2.0) -> bool:
    """Whether ``url`` answers with a status below 500."""
    try:
        return httpx.get(url, timeout=timeout).status_code < 500
    except httpx.HTTPError:
        return False


def start_all(parts: list[Process], timeout: float = READY_TIMEOUT) -> None:
    """Spawn every part side by side, then wait for each (the slowest sets the pace)."""
    for part in parts:
        if not part.running:
            part.spawn()
    for part in parts:
        part.ready(timeout)


def stop_all(parts: list[Process]) -> None:
    """SIGTERM to every part at once, then wait for each."""
    for part in parts:
        part.send(signal.SIGTERM)
    error = first_error([part.wait for part in parts])
    if error is not None:
        raise error


def first_error(actions: list[Callable[[], None]]) -> BaseException | None:
    """Run every action (a teardown must not stop at the first failure); the first error."""
    error: BaseException | None = None
    for action in actions:
        try:
            action()
        except Exception as caught:
            error = error or caught
    return error


def run(argv: list[str], stdin: str | None = None) -> str:
    """Run a command that must succeed; its output, or a LaneError quoting its stderr."""
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise LaneError(f"{' '.join(argv[:4])}: {done.stderr.strip() or done.returncode}")
    return done.stdout


LISTEN_PORTS_FROM = 10_000  # below: ports well-known services may want
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now, picked at random below the kernel's range for the
    source ports of outgoing connections: a port the kernel hands out as free (port 0)
    lies in that range, where any connection of any process may take it before the part
    told to listen on it binds it. Another picker may still race it, rarely."""
    try:
        ephemeral_from = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_from = 32_768
    if ephemeral_from - LISTEN_PORTS_FROM >= 1000:
        for _ in range(100):
            port = random.randrange(LISTEN_PORTS_FROM, ephemeral_from)
            with socket.socket() as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as sock:  # no room below the range: the kernel's pick
        sock.bind((host, 0))
        picked: int = sock.getsockname()[1]
        return picked

"""``sandboxctl status`` on a one-node ``serve``: what an operator waits for.

A ``serve`` (template ``base``: no build, one warm sandbox) runs on free loopback ports
with a state dir and runtime root of its own. Cases:

- ``status: process``: ``python -m sandboxctl status`` from start to exit, read from the
  fleet's state dir (its four endpoints probed, and its agent, which
  ``endpoints.json`` names, read), the interpreter's start and every import included:
  the figure the issue sets at 300 ms.
- ``status -o json: process``: the same, printing the JSON document.
- ``sandboxctl --version: process``: the floor under both, the interpreter and the CLI's
  own start with no verb's work.

Each process case gives its wall time and its CPU time (``cpu_p50_ms``, user and system),
which a machine busy with other work inflates less.
- ``status: collection in process``: one read of the fleet once every module is loaded
  (``collect_status``), the part a ``--watch`` frame repeats.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks import Row, with_target
from benchmarks.timing import measure

NAME = "status"
TARGET_MS = 300.0
RUNS = 15
WARMUP = 2
READY_TIMEOUT = 120.0
UID_BASE = 3_600_000


def run() -> Iterator[Row]:
    reason = _unavailable()
    if reason:
        yield _row("skipped", reason=reason)
        return
    work = Path(tempfile.mkdtemp(prefix="sandboxctl-bench-status-", dir="/tmp"))
    work.chmod(0o711)
    try:
        with _serve(work) as state_dir:
            yield from _processes(state_dir)
            yield _collection(state_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _processes(state_dir: Path) -> Iterator[Row]:
    # No --sandboxd-seeds: serve names its agent in the state dir, as an operator reads it.
    status = [sys.executable, "-m", "sandboxctl", "status", "--state-dir", str(state_dir)]
    for case, command in (
        ("status: process", status),
        ("status -o json: process", [*status, "-o", "json"]),
    ):
        figures = _process(command)
        yield with_target(
            _row(case, **figures), figures["p50_ms"] <= TARGET_MS, f"p50 <= {TARGET_MS:.0f} ms"
        )
    floor = _process([sys.executable, "-m", "sandboxctl", "--version"])
    yield _row("sandboxctl --version: process (the floor)", **floor)


def _process(command: list[str]) -> dict[str, float]:
    """The wall times of ``command`` run to its end, and its median CPU time."""
    cpu: list[float] = []
    timing = measure(lambda: cpu.append(_run(command)), runs=RUNS, warmup=WARMUP)
    return {**timing.figures("ms"), "cpu_p50_ms": _median(cpu[WARMUP:])}


def _collection(state_dir: Path) -> Row:
    from sandboxctl.core.freshness import FreshnessRule
    from sandboxctl.inventory.status import FromStateDir, collect_status

    source = FromStateDir(state_dir)
    rule = FreshnessRule()
    timing = measure(lambda: collect_status(source, rule), runs=50, warmup=3)
    return _row("status: collection in process", **timing.figures("ms"))


def _run(command: list[str]) -> float:
    """Run ``command`` to its end; the CPU time it took (user and system, ms), which a
    busy machine inflates less than the wall time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, capture_output=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr!r}")
    spent = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return spent * 1000


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 1)


class _serve:
    """``serve`` over ``work`` until the block ends (SIGTERM: it destroys its sandboxes);
    enters as its state dir."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Path:
        ports = [_free_port() for _ in range(4)]
        state_dir = self.work / "state"
        runtime = self.work / "runtime"
        runtime.mkdir(mode=0o711)
        log = self.work / "serve.log"
        flags = {"--state-dir": str(state_dir), "--e2b-port": str(ports[0]),
                 "--proxy-port": str(ports[1]), "--kube-port": str(ports[2]),
                 "--sandboxd-port": str(ports[3]), "--template": "base", "--pool": "base=1",
                 "--uid-base": str(UID_BASE)}  # fmt: skip
        command = [
            sys.executable,
            "-m",
            "sandboxctl",
            "serve",
            *(x for kv in flags.items() for x in kv),
        ]
        env = {**os.environ, "SANDBOXCTL_RUNTIME_ROOT": str(runtime)}
        with log.open("wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + READY_TIMEOUT
        while "ready: " not in log.read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"serve did not get ready:\n{log.read_text()[-2000:]}")
            time.sleep(0.1)  # a process's output: nothing to wait on but the file
        return state_dir

    def __exit__(self, *exc: object) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _unavailable() -> str | None:
    from sandboxctl.core.errors import SandboxctlError
    from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime

    if os.geteuid() != 0:
        return "needs root (serve's sandbox uids)"
    try:
        BubblewrapRuntime.check()
    except SandboxctlError as error:
        return str(error)
    return None


def _row(case: str, **figures: object) -> Row:
    return {"benchmark": NAME, "case": case, **figures}

"""``sandboxctl serve`` as a real process on free loopback ports, for the tests that drive
a whole one-host fleet (tests/fleet)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from sandboxctl.sandboxd.procfs import pids_of_uids
from sandboxctl.sandboxd.templates.store import STORE_ENV
from tests.sandboxd.servers import free_port, wait_until
from tests.sandboxd.templates.cache import seed

READY_TIMEOUT = 90.0
STOP_TIMEOUT = 60.0  # the agent alone may wait 30 s for a start in flight, then destroys
UID_SPAN = 20  # the uids one fleet may give its sandboxes


@dataclass
class Fleet:
    state_dir: Path
    ports: dict[str, int]
    uid_base: int
    process: subprocess.Popen[bytes]
    log: IO[bytes]

    @property
    def e2b_env(self) -> dict[str, str]:
        """``E2B_API_KEY``, ``E2B_API_URL`` and ``E2B_SANDBOX_URL`` from ``DIR/e2b.env``."""
        text = (self.state_dir / "e2b.env").read_text()
        return dict(line.split("=", 1) for line in text.splitlines() if line)

    @property
    def sdk(self) -> dict[str, str]:
        """The e2b SDK's connection options for this fleet (``create_sandbox(fleet.sdk)``)."""
        env = self.e2b_env
        return {
            "api_key": env["E2B_API_KEY"],
            "api_url": env["E2B_API_URL"],
            "sandbox_url": env["E2B_SANDBOX_URL"],
        }

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(
                f"serve did not stop within {STOP_TIMEOUT}s:\n{self.output()}"
            ) from None


def free_ports() -> dict[str, int]:
    return {name: free_port() for name in ("e2b", "proxy", "kube", "sandboxd")}


def serve_command(
    state_dir: Path, ports: dict[str, int], uid_base: int, pool: str = "default=1"
) -> list[str]:
    """``serve`` on these ports, with one warm sandbox of its default template (the
    session's template store has it once ``seed_store`` ran)."""
    return [
        sys.executable,
        "-m",
        "sandboxctl",
        "serve",
        "--state-dir",
        str(state_dir),
        "--host",
        "127.0.0.1",
        "--e2b-port",
        str(ports["e2b"]),
        "--proxy-port",
        str(ports["proxy"]),
        "--kube-port",
        str(ports["kube"]),
        "--sandboxd-port",
        str(ports["sandboxd"]),
        "--pool",
        pool,
        "--uid-base",
        str(uid_base),
    ]


def seed_store() -> None:
    """The session's template store (SANDBOXCTL_TEMPLATE_STORE) with serve's default
    template, from the machine's template cache: serve finds it instead of building it."""
    seed(Path(os.environ[STORE_ENV]))


def start_fleet(
    state_dir: Path,
    ports: dict[str, int],
    uid_base: int,
    *extra: str,
    cwd: Path | None = None,
    pool: str = "default=1",
) -> Fleet:
    """Start ``sandboxctl serve`` and wait for its ``ready:`` line (the caller stops it).

    With ``cwd`` it runs there and a relative ``state_dir`` is taken from there, as
    ``make serve`` in a checkout does; it still runs the sandboxctl under test, not a
    copy that ``cwd`` may hold (PYTHONSAFEPATH: ``-m`` does not put ``cwd`` on the path).
    """
    seed_store()
    log = tempfile.TemporaryFile()  # noqa: SIM115 (the Fleet's to close)
    command = [*serve_command(state_dir, ports, uid_base, pool), *extra]
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env)
    fleet = Fleet((cwd or Path.cwd()) / state_dir, ports, uid_base, process, log)

    def ready() -> bool:
        return process.poll() is not None or any(
            line.startswith("ready: ") for line in fleet.output().splitlines()
        )

    try:
        wait_until(ready, timeout=READY_TIMEOUT, interval=0.1, what="the ready line")
    except AssertionError:
        stop_fleets([fleet])
        raise
    if process.poll() is not None:
        output = fleet.output()
        log.close()
        raise AssertionError(f"serve exited with {process.returncode}:\n{output}")
    return fleet


def stop_fleets(fleets: list[Fleet]) -> None:
    """SIGTERM each fleet still running (serve destroys its sandboxes; SIGKILL would not),
    then kill what a failed test may have left in their uid blocks."""
    try:
        for fleet in fleets:
            if fleet.process.poll() is None:
                fleet.stop()
    finally:
        for fleet in fleets:
            fleet.log.close()
            for pid in sandbox_uids(fleet.uid_base):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


def sandbox_uids(uid_base: int) -> dict[int, int]:
    """pid -> uid of every live process (zombies are not) in the sandbox uid block."""
    return pids_of_uids(range(uid_base, uid_base + UID_SPAN))

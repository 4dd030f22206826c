"""Nothing a tenant sends reaches a host process: the environment and command of
``commands.run`` and the create's ``envs`` exist only inside the sandbox. Attacked with the
unmodified e2b SDK, as a tenant would: a shared library written into the sandbox's home,
named by the host path every root helper could load it from (``/proc/PID/root/...``), in
``LD_PRELOAD``; ``LD_DEBUG_OUTPUT`` pointed at the host's /tmp; and a canary looked for in
the environment and command line of every host process while a command runs."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandboxctl.sandboxd import procfs
from tests.proxy.sdk_stack import create_sandbox
from tests.sandboxd.servers import wait_until

# A constructor that, run as any process that loads it, leaves a file named by MARKER
# (a host path: inside a sandbox the same path is the sandbox's own /tmp).
LIBRARY = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    int fd = open(MARKER, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) { write(fd, "loaded\n", 7); close(fd); }
}
"""


@pytest.fixture
def sandbox(sdk: dict[str, Any]) -> Iterator[Any]:
    box = create_sandbox(sdk)
    yield box
    box.kill()


@pytest.fixture
def host_tmp() -> Iterator[Path]:
    """A directory of the host's /tmp that the attack aims at."""
    path = Path(tempfile.mkdtemp(prefix="sandboxctl-attack-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _host_pid_of(sandbox: Any) -> int:
    """A host pid of the sandbox, as an attacker finds one (the old 502 text gave it away;
    else a few thousand tries): every process of the sandbox has its uid."""
    uid = int(sandbox.commands.run("id -u").stdout)
    host = procfs.pid_namespace(os.getpid())
    inside = [pid for pid in procfs.pids_of_uid(uid) if procfs.pid_namespace(pid) != host]
    return min(inside)


def _library(marker: Path) -> bytes:
    if shutil.which("cc") is None:
        pytest.fail("the attack needs a C compiler on the host (apt-get install gcc)")
    with tempfile.TemporaryDirectory() as build:
        source, output = Path(build, "m.c"), Path(build, "m.so")
        source.write_text(LIBRARY)
        subprocess.run(
            ["cc", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", output, source], check=True
        )
        return output.read_bytes()


def test_ld_preload_of_a_command_never_loads_into_a_host_helper(
    sandbox: Any, host_tmp: Path
) -> None:
    marker = host_tmp / "preloaded"
    sandbox.files.write("/home/user/m.so", _library(marker))
    on_host = f"/proc/{_host_pid_of(sandbox)}/root/home/user/m.so"
    assert Path(on_host).exists()  # the host path is real: root could load it
    result = sandbox.commands.run("echo ran", envs={"LD_PRELOAD": on_host})
    assert result.stdout == "ran\n"
    # Inside, the same variable works on the tenant's own command, loading its library
    # from its own path, and marking the sandbox's /tmp, not the host's.
    sandbox.commands.run(f"mkdir -p {host_tmp}")
    inside = sandbox.commands.run(
        f"cat {marker} && echo found", envs={"LD_PRELOAD": "/home/user/m.so"}
    )
    assert inside.stdout.endswith("found\n")
    assert not marker.exists()


def test_ld_debug_output_of_a_create_and_a_command_writes_nothing_on_the_host(
    sdk: dict[str, Any], host_tmp: Path
) -> None:
    aimed = host_tmp / "debug"
    box = create_sandbox(sdk, envs={"LD_DEBUG": "libs", "LD_DEBUG_OUTPUT": str(aimed)})
    quiet = {"LD_DEBUG": ""}
    try:
        box.commands.run(f"mkdir -p {host_tmp}", envs=quiet)
        box.commands.run("true")
        box.commands.run("true", envs={"LD_DEBUG": "all", "LD_DEBUG_OUTPUT": f"{aimed}-run"})
        # The tenant's own commands did write their debug output: into the sandbox.
        listed = box.commands.run(f"ls {host_tmp}", envs=quiet).stdout.split()
        assert any(name.startswith("debug-run.") for name in listed)
        assert any(name.startswith("debug.") for name in listed)
    finally:
        box.kill()
    assert list(host_tmp.iterdir()) == []


def test_no_host_process_but_the_command_itself_holds_a_tenants_variable_or_argument(
    sandbox: Any,
) -> None:
    canary = "canary-" + secrets.token_hex(8)
    uid = int(sandbox.commands.run("id -u").stdout)
    running = sandbox.commands.run(
        f"sleep 60 # {canary}", envs={"DB_PASSWORD": canary}, background=True
    )
    try:
        # Every process that holds the canary, once the command runs inside.
        holders = wait_until(lambda: _holding(canary) or None, what="the command to run")
        outside = {pid: owner for pid, owner in holders.items() if owner != uid}
        assert outside == {}, f"host processes with the tenant's data: {outside}"
    finally:
        running.kill()


def _holding(canary: str) -> dict[int, int]:
    """pid -> uid of every process whose environment or command line holds ``canary``."""
    found = {}
    needle = canary.encode()
    for pid in procfs.all_pids():
        try:
            data = Path(f"/proc/{pid}/environ").read_bytes()
            data += Path(f"/proc/{pid}/cmdline").read_bytes()
            uid = Path(f"/proc/{pid}").stat().st_uid
        except OSError:
            continue
        if needle in data:
            found[pid] = uid
    return found


def test_a_command_that_ends_at_once_reports_its_pid_inside_the_sandbox(sandbox: Any) -> None:
    """A command too quick to be seen inside used to be reported by its host pid."""
    pids = [sandbox.commands.run("true", background=True).pid for _ in range(20)]
    inside = [int(p) for p in sandbox.commands.run("echo $$; sh -c 'echo $$'").stdout.split()]
    # Pids inside a fresh sandbox's own namespace count up from 1, a handful a command.
    assert all(0 < pid < inside[-1] for pid in pids), (pids, inside)
    assert inside[-1] < 1000

"""``make serve`` from a checkout anywhere: a clone in a home only its owner may
enter (mode 0700, like root's) serves sandboxes to the unmodified e2b SDK with its default
state directory, and two checkouts on one host serve side by side without touching each
other's state, sandboxes or uids."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet.fleet import (
    Fleet,
    free_ports,
    sandbox_uids,
    serve_command,
    start_fleet,
    stop_fleets,
)
from tests.sandboxd.servers import sandboxes_unavailable, wait_until

pytestmark = [
    pytest.mark.skipif(sandboxes_unavailable() is not None, reason=str(sandboxes_unavailable())),
    pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed"),
]

REPOSITORY = Path(__file__).resolve().parents[2]
STATE_DIR = Path(".sandboxctl")  # serve's default, relative to the checkout
ECHO_HI = (
    "from e2b import Sandbox; s = Sandbox.create(); "
    'print(s.commands.run("echo hi").stdout, end=""); s.kill()'
)


@pytest.fixture
def home() -> Iterator[Path]:
    """A home directory like root's: mode 0700 (and so is the temporary dir above it)."""
    top = Path(tempfile.mkdtemp(prefix="sandboxctl-home-"))
    path = top / "home"
    path.mkdir(mode=0o700)
    yield path
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def fleets() -> Iterator[list[Fleet]]:
    started: list[Fleet] = []
    yield started
    stop_fleets(started)


def _clone(home: Path, name: str) -> Path:
    checkout = home / name
    subprocess.run(
        ["git", "clone", "--quiet", str(REPOSITORY), str(checkout)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return checkout


def _serve(checkout: Path, uid_base: int, fleets: list[Fleet]) -> Fleet:
    """``sandboxctl serve`` run in the checkout, with its default state dir."""
    fleet = start_fleet(STATE_DIR, free_ports(), uid_base, cwd=checkout)
    fleets.append(fleet)
    return fleet


def _echo_hi(fleet: Fleet) -> str:
    """The README's one-liner: the e2b SDK configured by ``e2b.env`` alone."""
    done = subprocess.run(
        [sys.executable, "-c", ECHO_HI],
        env={**os.environ, **fleet.e2b_env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _runtime_dir(fleet: Fleet) -> Path:
    link = fleet.state_dir / "runtime"
    assert link.is_symlink()
    return link.resolve()


def _home_uids(runtime: Path) -> set[int]:
    """The uids of the sandboxes whose passwd files are in a runtime dir (one per live
    sandbox: the file's group is the sandbox's uid)."""
    return {passwd.stat().st_gid for passwd in (runtime / "homes").glob("*.passwd")}


def test_serve_from_a_checkout_in_a_private_home(  # type: ignore[no-untyped-def]
    home: Path, uid_base: int, runtime_root: Path, fleets
) -> None:
    checkout = _clone(home, "sandboxctl")
    assert stat.S_IMODE(home.stat().st_mode) == 0o700

    fleet = _serve(checkout, uid_base, fleets)
    assert _echo_hi(fleet) == "hi\n"

    # The secrets stay in the state dir, which nobody else may enter; what sandbox uids
    # reach is in the runtime dir, which the state dir points to and serve prints.
    state = checkout / STATE_DIR
    assert fleet.state_dir == state
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    runtime = _runtime_dir(fleet)
    assert runtime.parent == runtime_root
    assert f"runtime dir     {runtime}" in fleet.output()
    for directory in (runtime, runtime / "homes"):
        info = directory.stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o711), directory
    assert _home_uids(runtime)  # the warm sandbox's
    assert not list(state.glob("**/homes"))

    # Stopped, it leaves no home behind; the next start reuses the runtime dir.
    assert fleet.stop() == 0, fleet.output()
    assert list((runtime / "homes").iterdir()) == []
    again = _serve(checkout, uid_base, fleets)
    assert _runtime_dir(again) == runtime
    assert again.stop() == 0, again.output()
    assert list((runtime / "homes").iterdir()) == []
    wait_until(lambda: not sandbox_uids(uid_base), timeout=10, what="no sandbox process")


def test_two_checkouts_serve_side_by_side(  # type: ignore[no-untyped-def]
    home: Path, uid_base: int, fleets
) -> None:
    # The same uids to start from, as two `make serve` runs with only the ports changed.
    first = _serve(_clone(home, "first"), uid_base, fleets)
    second = _serve(_clone(home, "second"), uid_base, fleets)
    runtimes = _runtime_dir(first), _runtime_dir(second)
    assert runtimes[0] != runtimes[1]
    uids = _home_uids(runtimes[0]), _home_uids(runtimes[1])
    assert uids[0]
    assert uids[1]
    assert not uids[0] & uids[1]

    # Stopping one destroys its own sandboxes only: the other's keep running and serve.
    assert first.stop() == 0, first.output()
    wait_until(
        lambda: set(sandbox_uids(uid_base).values()) == uids[1],
        timeout=10,
        what="only the second fleet's sandboxes",
    )
    assert _home_uids(runtimes[1]) == uids[1]
    assert _echo_hi(second) == "hi\n"


def test_a_runtime_root_others_may_write_is_refused_before_anything_is_written(
    state_dir: Path, uid_base: int
) -> None:
    shared = state_dir / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # and no sticky bit: anyone could swap what root makes there
    command = serve_command(state_dir / "fleet", free_ports(), uid_base)
    done = subprocess.run(
        [*command, "--runtime-root", str(shared / "runtime")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(
        f"sandboxctl: error: --runtime-root {shared / 'runtime'}: "
        f"others may write in {shared} (mode 0777); "
    )
    assert sorted(state_dir.iterdir()) == [shared]
    assert list(shared.iterdir()) == []

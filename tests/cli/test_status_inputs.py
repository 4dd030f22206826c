"""What ``status`` and ``inventory`` refuse before reading any fleet: one line on stderr
and exit 2, never a traceback, nothing on stdout."""

from __future__ import annotations

import inspect
import io
import subprocess
import sys
from pathlib import Path

import pytest

from sandboxctl.cli import serve as serve_verb
from sandboxctl.cli import status as status_verb
from sandboxctl.fleet import state as serve_state
from sandboxctl.inventory import status as reads
from tests.cli.conftest import Run


@pytest.mark.parametrize("fail_on_stale", [False, True])
def test_nothing_on_stdin_is_an_error_not_an_empty_fleet(
    run: Run, monkeypatch: pytest.MonkeyPatch, fail_on_stale: bool
) -> None:
    # What `kubectl get nodeinventories -o yaml | sandboxctl inventory --from -` gives when
    # kubectl fails: it prints nothing on stdout.
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n"))
    flags = ["--fail-on-stale"] if fail_on_stale else []
    result = run("inventory", "--from", "-", *flags)

    assert result.code == 2
    assert result.out == ""
    assert result.err == (
        "sandboxctl: error: --from -: nothing was read (did the command before the pipe fail?)\n"
    )


def test_a_list_with_no_items_is_still_an_empty_fleet(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("apiVersion: v1\nkind: List\nitems: []\n"))
    result = run("inventory", "--from", "-")

    assert result.code == 0
    assert result.out.splitlines()[-1] == "no nodes"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["inventory", "--source", "mesh"], "--source mesh needs --sandboxd-seeds"),
        (["inventory", "--source", "kube", "--sandboxd-seeds", "h:1"], "--sandboxd-seeds is for"),
        (["inventory", "--source", "mesh", "--from", "x.yaml"], "--from is for --source file"),
        (["inventory", "--source", "nats"], "--source 'nats': expected file, mesh or kube"),
        (["status", "--source", "mesh"], "--source mesh needs --sandboxd-seeds"),
        (["status", "--kubeconfig", "k"], "--kubeconfig is for --source kube, not state"),
        (["status", "--sandboxd-token-file", "t"], "--sandboxd-token-file is for --source mesh"),
        (["status", "--source", "kube", "--sandboxd-seeds", "h:1"], "--sandboxd-seeds is for"),
        (["status", "--interval", "0s"], "--interval must be positive"),
        (["status", "--interval", "soon"], "Invalid value for '--interval'"),
        (["status", "--source", "nats"], "Invalid value for '--source'"),
    ],
)
def test_flags_that_do_not_fit_are_one_line(run: Run, args: list[str], message: str) -> None:
    result = run(*args)

    assert result.code == 2
    assert result.out == ""
    [line] = result.err.splitlines()
    assert line.startswith("sandboxctl: error: ")
    assert message in line


def test_a_missing_state_dir_says_who_writes_it(run: Run, tmp_path: Path) -> None:
    result = run("status", "--state-dir", str(tmp_path / "nowhere"))

    assert result.code == 2
    assert result.err == (
        f"sandboxctl: error: --state-dir {tmp_path / 'nowhere'}: no such directory: serve "
        "writes it on its first start (make serve, or sandboxctl serve --state-dir DIR)\n"
    )


def test_a_state_dir_serve_has_not_written_yet_names_the_file(run: Run, tmp_path: Path) -> None:
    result = run("status", "--state-dir", str(tmp_path))

    assert result.code == 2
    assert result.err == (
        f"sandboxctl: error: --state-dir: {tmp_path / 'e2b.env'} does not exist: serve "
        "writes it once it has started\n"
    )


def test_status_reads_the_files_serve_writes_where_serve_writes_them() -> None:
    """status cannot import serve's stack (its start would cost a quarter of a second),
    so it names serve's files and defaults itself; they must stay serve's."""
    assert reads.ENV_FILE == serve_state.ENV_FILE
    assert reads.KUBECONFIG_FILE == serve_state.KUBECONFIG_FILE
    assert reads.TOKEN_FILE == serve_state.TOKEN_FILE
    defaults = inspect.signature(serve_verb.serve).parameters
    assert defaults["sandboxd_port"].default == reads.SERVE_SANDBOXD_PORT
    assert defaults["state_dir"].default == status_verb.DEFAULT_STATE_DIR


def test_status_starts_without_the_servers_stack() -> None:
    """What ``sandboxctl status`` loads to parse its flags: nothing of the servers, the
    agents' HTTP client or the Kubernetes client (they cost its start)."""
    probe = (
        "import sys; from sandboxctl.cli.app import app, _Verbs; import typer; "
        "typer.main.get_command(app).get_command(None, 'status'); "
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('uvicorn', 'fastapi', 'httpx', 'kubernetes', 'starlette'))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert loaded == []

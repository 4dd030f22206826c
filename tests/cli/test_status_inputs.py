"""What ``status`` and ``inventory`` refuse before reading any fleet: one line on stderr
and exit 2, never a traceback, nothing on stdout."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import Run
from tests.sandboxd.servers import free_port


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
        (["inventory", "--sandboxd-token-file", "t"], "--sandboxd-token-file is for --source mesh"),
        (["status", "--source", "mesh"], "--source mesh needs --sandboxd-seeds"),
        (["status", "--kubeconfig", "k"], "--kubeconfig is for --source kube, not state"),
        (["status", "--sandboxd-token-file", "t"], "--sandboxd-token-file is for --source mesh"),
        (["status", "--source", "kube", "--sandboxd-seeds", "h:1"], "--sandboxd-seeds is for"),
        (["status", "--interval", "0s"], "--interval must be positive"),
        (["status", "--interval", "soon"], "Invalid value for '--interval'"),
        (["status", "--source", "nats"], "--source 'nats': expected state, mesh or kube"),
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


SEEDS_MISFIT = "--sandboxd-seeds is for --source mesh{}, not kube"


@pytest.mark.parametrize(
    ("flags", "refusal"),
    [
        (["--source", "kube", "--sandboxd-token-file", "t"],
         "--sandboxd-token-file is for --source mesh, not kube"),
        (["--source", "kube", "--sandboxd-seeds", "h:1"], SEEDS_MISFIT),
        (["--source", "mesh", "--kubeconfig", "k"], "--kubeconfig is for --source kube, not mesh"),
        (["--source", "mesh"], "--source mesh needs --sandboxd-seeds HOST:PORT[,HOST:PORT...]"),
    ],
)  # fmt: skip
def test_inventory_and_status_refuse_the_same_flags_alike(
    run: Run, flags: list[str], refusal: str
) -> None:
    """One check of the source flags: the verbs refuse a misfit flag in the same words
    (status also takes --sandboxd-seeds for its state source, which inventory has not)."""
    for verb, seeds_also in (("inventory", ""), ("status", " or state")):
        result = run(verb, *flags)
        assert (result.code, result.out) == (2, ""), verb
        assert result.err == f"sandboxctl: error: {refusal.format(seeds_also)}\n", verb


def test_no_verb_loads_httpx_s_own_command_line() -> None:
    """httpx imports its CLI (click, rich's progress, pygments) whenever they are
    installed; the entry point keeps it out of every verb that loads httpx."""
    nobody = f"127.0.0.1:{free_port()}"  # refused at once: the verb loads httpx and fails
    probe = (
        "import sys\n"
        "from sandboxctl.cli.app import main\n"
        "try:\n"
        f"    main(['inventory', '--source', 'mesh', '--sandboxd-seeds', '{nobody}'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('httpx' in sys.modules, sys.modules.get('httpx._main') is not None)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)

    assert done.stdout.split() == ["True", "False"], done.stderr

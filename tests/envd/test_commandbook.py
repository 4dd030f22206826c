"""The command book on a real directory: what it writes is root's alone, no id it is
given names a file outside it, and a sandbox's entries are bounded. (That a restarted
agent lists and kills through it: tests/fleet/test_serve.py; that a forged entry reaches
nothing: test_adopted.py.)"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from sandboxctl.sandboxd.commandbook import (
    COMMANDS_DIR,
    MAX_BYTES,
    MAX_ENTRIES,
    BookFull,
    CommandBook,
)

SANDBOX = "sbx-1"
BODY = {"pid": 7, "config": {"cmd": "/bin/true"}}


def _book(tmp_path: Path) -> CommandBook:
    tmp_path.chmod(0o755)
    return CommandBook(tmp_path / COMMANDS_DIR, lambda sandbox_id: sandbox_id == SANDBOX)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_every_directory_is_0700_and_every_entry_0600_and_the_agents(tmp_path: Path) -> None:
    book = _book(tmp_path)
    book.write(SANDBOX, 7, BODY)

    entry = book.directory / SANDBOX / "7.json"
    assert [_mode(p) for p in (book.directory, book.directory / SANDBOX, entry)] == [
        0o700,
        0o700,
        0o600,
    ]
    assert {p.lstat().st_uid for p in (book.directory, entry)} == {os.geteuid()}
    assert os.listdir(book.directory / SANDBOX) == ["7.json"]  # no scratch file left
    assert book.read(SANDBOX, ()) == [(7, BODY)]


def test_a_folder_made_wider_is_narrowed_and_a_symlink_in_its_place_refused(
    tmp_path: Path,
) -> None:
    book = _book(tmp_path)
    book.directory.mkdir(mode=0o755)
    book.directory.chmod(0o755)
    book.write(SANDBOX, 7, BODY)
    assert _mode(book.directory) == 0o700

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (book.directory / "sbx-2").symlink_to(elsewhere)
    with pytest.raises(OSError, match="not a directory of the agent's"):
        book.write("sbx-2", 8, BODY)
    assert not os.listdir(elsewhere)


@pytest.mark.parametrize("sandbox_id", ["../sbx-1", "sbx-1/..", ".", "..", "", "sbx-1\n", "a/b"])
def test_no_sandbox_id_names_a_path(tmp_path: Path, sandbox_id: str) -> None:
    book = _book(tmp_path)
    with pytest.raises(ValueError, match="not a sandbox id"):
        book.write(sandbox_id, 7, BODY)
    with pytest.raises(ValueError, match="not a sandbox id"):
        book.remove(sandbox_id, 7)
    assert not book.directory.exists()


@pytest.mark.parametrize("pid", [0, -1, True, "7", "../7", 7.0])
def test_no_pid_names_a_path(tmp_path: Path, pid: object) -> None:
    book = _book(tmp_path)
    with pytest.raises(ValueError, match="not a pid"):
        book.write(SANDBOX, pid, BODY)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a pid"):
        book.remove(SANDBOX, pid)  # type: ignore[arg-type]


def test_a_file_that_is_not_an_entry_is_neither_read_nor_removed(tmp_path: Path) -> None:
    book = _book(tmp_path)
    book.write(SANDBOX, 7, BODY)
    folder = book.directory / SANDBOX
    for name in ("0.json", "7.json\n", "x.json", ".7.json.abc"):
        (folder / name).write_text("{}")

    assert book.read(SANDBOX, ()) == [(7, BODY)]
    assert sorted(os.listdir(folder)) == sorted(
        ["7.json", "0.json", "7.json\n", "x.json", ".7.json.abc"]
    )


def test_a_sandboxs_entries_are_bounded_in_number(tmp_path: Path) -> None:
    book = _book(tmp_path)
    for pid in range(1, MAX_ENTRIES + 1):
        book.write(SANDBOX, pid, BODY)

    with pytest.raises(BookFull, match="at their bound"):
        book.write(SANDBOX, MAX_ENTRIES + 1, BODY)
    assert len(os.listdir(book.directory / SANDBOX)) == MAX_ENTRIES
    book.write("sbx-2", 1, BODY)  # another sandbox's are its own
    book.remove(SANDBOX, 1)
    book.write(SANDBOX, MAX_ENTRIES + 1, BODY)  # room again once one ends


def test_a_sandboxs_entries_are_bounded_in_bytes(tmp_path: Path) -> None:
    book = _book(tmp_path)
    half = {"config": {"envs": {"A": "x" * (MAX_BYTES // 2)}}}
    book.write(SANDBOX, 1, half)

    with pytest.raises(BookFull, match="at their bound"):
        book.write(SANDBOX, 2, half)
    assert os.listdir(book.directory / SANDBOX) == ["1.json"]
    assert json.loads((book.directory / SANDBOX / "1.json").read_text()) == half


def test_prune_drops_the_entries_of_sandboxes_the_agent_no_longer_has(tmp_path: Path) -> None:
    book = _book(tmp_path)
    book.write(SANDBOX, 7, BODY)
    book.write("sbx-gone", 7, BODY)

    book.prune()
    assert os.listdir(book.directory) == [SANDBOX]

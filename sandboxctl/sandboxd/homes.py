"""Where each sandbox's home is on the host, and removing the homes of no sandbox.

A sandbox's home is ``HOMES/ID`` in the runtime dir (``runtimedir.py``: the directory
sandbox uids reach), with its passwd, group and hosts files beside it (``ID.passwd``...); the
runtime creates and owns their contents. An agent from before runtime dirs kept the homes
in its state dir: a sandbox adopted from there keeps its home there until it ends.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterable
from pathlib import Path

from sandboxctl.sandboxd.runtimedir import HOMES

# Next to each home: the files bound over its /etc/passwd, /etc/group and /etc/hosts.
HOME_FILES = (".passwd", ".group", ".hosts", ".passwd.tmp", ".group.tmp", ".hosts.tmp")


class Homes:
    def __init__(self, runtime_dir: Path, state_dir: Path) -> None:
        self.directory = runtime_dir / HOMES
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o711)  # sandbox uids must traverse to their own home
        self._old = state_dir / HOMES if runtime_dir != state_dir else None
        self._in_old: set[str] = set()

    def path(self, sandbox_id: str) -> Path:
        if self._old is not None and sandbox_id in self._in_old:
            return self._old / sandbox_id
        return self.directory / sandbox_id

    def find_old(self, sandbox_ids: Iterable[str]) -> None:
        """Note which of these sandboxes (on disk from the last run) have their home in
        the old homes dir."""
        if self._old is not None and self._old.is_dir():
            self._in_old = {i for i in sandbox_ids if (self._old / f"{i}.passwd").exists()}

    def ended(self, sandbox_id: str) -> None:
        """The sandbox is gone; its home went with it (the runtime's destroy)."""
        self._in_old.discard(sandbox_id)

    def remove(self, sandbox_id: str) -> None:
        home = self.path(sandbox_id)
        for entry in (home, *(home.with_name(home.name + suffix) for suffix in HOME_FILES)):
            _remove(entry)
        self._in_old.discard(sandbox_id)

    def remove_others(self, keep: set[str]) -> None:
        """Remove every home and home file of a sandbox not in ``keep``; the old homes
        dir goes too once it is empty."""
        for directory in (self.directory, self._old):
            if directory is not None and directory.is_dir():
                for entry in directory.iterdir():
                    if _sandbox_of(entry.name) not in keep:
                        _remove(entry)
        if self._old is not None and self._old.is_dir():
            with contextlib.suppress(OSError):  # not empty: sandboxes adopted from there
                self._old.rmdir()


def _sandbox_of(name: str) -> str:
    """The sandbox a homes-dir entry belongs to: ``ID``, ``ID.passwd``, ``ID.group``..."""
    return name.split(".", 1)[0]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)  # fd-based: symlinks inside are not followed
    else:
        path.unlink(missing_ok=True)

"""The commands envd started, kept on disk so that an agent that restarts and adopts a
sandbox still lists and kills the commands its earlier process started.

Trust rule: an entry is a claim, never a fact. Whoever reads one acts on it only while
its host pid is still the very process that was started (its start time), in that
sandbox's pid namespace, under that sandbox's uid (``envd_host.RuntimeSandbox`` checks
it, and checks it again with the process pinned by a pidfd before any signal), so
neither a stale entry nor a recycled pid reaches another sandbox's process or the host's.

Layout, in the agent's own state dir (root's, which no sandbox can reach)::

    DIR/                    0700  COMMANDS_DIR
    DIR/SANDBOX_ID/         0700  one per sandbox, removed with it (``prune``)
    DIR/SANDBOX_ID/PID.json 0600  one per running command, removed at its end

A tenant decides how many commands run and how large each one's arguments and
environment are, so a sandbox's entries are bounded (``MAX_ENTRIES``, ``MAX_BYTES``): past
either bound a command still runs; only an adopting restart would not list it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sandboxctl.sandboxd.runtime import SIZE_LIMITS
from sandboxctl.secretfiles import write_private

COMMANDS_DIR: Final = "envd-commands"  # in the agent's state dir
# No sandbox runs more processes than this, so more entries than this are never all
# running commands; entries of commands that ended while no agent watched count too.
MAX_ENTRIES: Final = max(limits.max_processes for limits in SIZE_LIMITS.values())
MAX_BYTES: Final = 4 << 20  # of one sandbox's entries together
_SANDBOX_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,128}")
_ENTRY: Final = re.compile(r"([1-9][0-9]{0,9})\.json")


class BookFull(OSError):
    """A sandbox's entries are at their bound: this command is not kept."""


@dataclass(frozen=True, slots=True)
class CommandBook:
    """One file per command (``DIR/SANDBOX_ID/PID.json``), written when it starts and
    removed when it ends."""

    directory: Path
    holds: Callable[[str], bool]  # whether the agent still has this sandbox

    def write(self, sandbox_id: str, pid: int, body: Mapping[str, Any]) -> None:
        """Keep ``body`` as command ``pid``'s entry; BookFull (an OSError) when the
        sandbox's entries would pass a bound."""
        text = json.dumps(body)
        folder = self._folder(sandbox_id)
        _private_dir(self.directory)
        _private_dir(folder)
        count, size = _usage(folder)
        if count + 1 > MAX_ENTRIES or size + len(text) > MAX_BYTES:
            raise BookFull(
                f"its commands' entries are at their bound ({count} files, {size} bytes; "
                f"at most {MAX_ENTRIES}, {MAX_BYTES})"
            )
        # Not synced: an agent's restart keeps the page cache, and a host's reboot ends
        # every command, so a lost entry is one nobody needs, and an fsync would add a
        # disk flush to every command's start.
        write_private(self._file(sandbox_id, pid), text, sync=False)

    def remove(self, sandbox_id: str, pid: int) -> None:
        self._file(sandbox_id, pid).unlink(missing_ok=True)

    def read(self, sandbox_id: str, skip: Collection[int]) -> list[tuple[int, Any]]:
        """(pid, body) of each entry of ``sandbox_id`` but ``skip``'s; an unreadable one
        is removed."""
        found = []
        try:
            names = os.listdir(self._folder(sandbox_id))
        except FileNotFoundError:
            return []
        for name in names:
            match = _ENTRY.fullmatch(name)
            if match is None or int(match[1]) in skip:
                continue
            pid = int(match[1])
            try:
                found.append((pid, json.loads(self._file(sandbox_id, pid).read_text())))
            except FileNotFoundError:
                continue  # it ended meanwhile
            except (OSError, ValueError):
                self.remove(sandbox_id, pid)
        return found

    def prune(self) -> None:
        """Drop the entries of every sandbox the agent no longer has: their commands
        ended with them (an agent that stopped while they ran never removed theirs)."""
        try:
            folders = os.listdir(self.directory)
        except FileNotFoundError:
            return
        for name in folders:
            if _SANDBOX_ID.fullmatch(name) and not self.holds(name):
                shutil.rmtree(self.directory / name, ignore_errors=True)

    def _folder(self, sandbox_id: str) -> Path:
        if not _SANDBOX_ID.fullmatch(sandbox_id):  # the agent's own ids; never a path
            raise ValueError(f"not a sandbox id: {sandbox_id!r}")
        return self.directory / sandbox_id

    def _file(self, sandbox_id: str, pid: int) -> Path:
        if type(pid) is not int or pid <= 0:  # a name of digits only; never a path
            raise ValueError(f"not a pid: {pid!r}")
        return self._folder(sandbox_id) / f"{pid}.json"


def _private_dir(path: Path) -> None:
    """``path`` as a directory of root's that only root may enter (0700), made if it is
    missing; anything else there (a symlink, another owner's) is refused."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise OSError(f"{path} is not a directory of the agent's")
    if stat.S_IMODE(info.st_mode) != 0o700:
        path.chmod(0o700)


def _usage(folder: Path) -> tuple[int, int]:
    """How many files ``folder`` holds and their bytes (a scratch file left by a crash
    counts too)."""
    count = size = 0
    with os.scandir(folder) as entries:
        for entry in entries:
            count += 1
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                size += entry.stat(follow_symlinks=False).st_size
    return count, size

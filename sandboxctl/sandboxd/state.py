"""The agent's state on disk: one SQLite row per sandbox, written before a claim is answered.

SQLite in WAL mode with ``synchronous=NORMAL`` survives the agent being killed at any
point (the OS holds what was committed); a power loss may lose the last commits. Pool
targets are configuration, not state: ``--pool`` flags apply at every start.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from sandboxctl.core import wire
from sandboxctl.core.errors import ConfigurationError
from sandboxctl.core.model import PoolKey
from sandboxctl.core.netpolicy import NetworkPolicy

STATE_FILE = "sandboxd.sqlite"  # in the state dir
_SCHEMA = """
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY,
    token TEXT NOT NULL,
    template TEXT NOT NULL,
    net TEXT NOT NULL,
    size TEXT NOT NULL,
    uid INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    start_time INTEGER NOT NULL,
    pid_namespace INTEGER NOT NULL,
    claimed INTEGER NOT NULL,
    claim_ref TEXT NOT NULL,
    metadata TEXT NOT NULL,
    ttl_seconds INTEGER NOT NULL,
    deadline REAL,
    claimed_at REAL,
    on_expire TEXT NOT NULL,
    hibernated INTEGER NOT NULL,
    created_at REAL NOT NULL,
    env TEXT NOT NULL DEFAULT '{}',
    address TEXT NOT NULL DEFAULT '',
    network TEXT NOT NULL DEFAULT '{}'
);
"""
# Columns added after the first release, with their definitions: a database written by an
# older agent gets them when it is opened.
_ADDED_COLUMNS = {
    "env": "TEXT NOT NULL DEFAULT '{}'",
    "address": "TEXT NOT NULL DEFAULT ''",
    "network": "TEXT NOT NULL DEFAULT '{}'",
}


@dataclass(slots=True)
class SandboxRecord:
    """One sandbox as the agent remembers it. Times are unix seconds (UTC)."""

    id: str
    token: str
    template: str
    net: str
    size: str
    uid: int
    pid: int
    start_time: int
    pid_namespace: int
    claimed: bool
    claim_ref: str
    metadata: dict[str, str]
    ttl_seconds: int
    deadline: float | None
    claimed_at: float | None
    on_expire: str
    hibernated: bool
    created_at: float
    # The claim's environment variables, for every process envd starts in the sandbox.
    # Values may be secrets: the agent's API never returns them.
    env: dict[str, str] = field(default_factory=dict)
    # Its address in the agent's sandbox subnet ("" without a network) and its policy.
    address: str = ""
    network: NetworkPolicy = field(default_factory=NetworkPolicy)

    @property
    def key(self) -> PoolKey:
        """The claim's key: ``net`` is the claim's (a warm one is ``none``)."""
        return PoolKey(self.template, self.net, self.size)


_COLUMNS = [f.name for f in fields(SandboxRecord)]


class StateStore:
    """Thread-safe; every write is committed before the call returns.

    The database holds every sandbox's token and env, so it is readable by its owner only
    (0600, and SQLite gives its -wal and -shm files the database's mode): a sandbox of the
    ``base`` template sees the host's filesystem, read-only.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        for owned in (path, *(path.with_name(path.name + s) for s in ("-wal", "-shm"))):
            with contextlib.suppress(FileNotFoundError):
                owned.chmod(0o600)  # a database from before this rule
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        try:
            [(verdict, *_), *_] = self._db.execute("PRAGMA quick_check").fetchall()
            if verdict != "ok":
                raise sqlite3.DatabaseError(verdict)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            present = {row[1] for row in self._db.execute("PRAGMA table_info(sandboxes)")}
            for name, definition in _ADDED_COLUMNS.items():
                if name not in present:
                    self._db.execute(f"ALTER TABLE sandboxes ADD COLUMN {name} {definition}")
        except sqlite3.DatabaseError as error:
            self._db.close()
            raise StateCorrupt(path, str(error)) from None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def put(self, record: SandboxRecord) -> None:
        values = [_to_column(getattr(record, name)) for name in _COLUMNS]
        marks = ",".join("?" * len(_COLUMNS))
        with self._lock:
            self._db.execute(
                f"INSERT OR REPLACE INTO sandboxes ({','.join(_COLUMNS)}) VALUES ({marks})",
                values,
            )

    def delete(self, sandbox_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM sandboxes WHERE id = ?", (sandbox_id,))

    def sandboxes(self) -> list[SandboxRecord]:
        try:
            with self._lock:
                rows = self._db.execute(
                    f"SELECT {','.join(_COLUMNS)} FROM sandboxes ORDER BY created_at, id"
                ).fetchall()
            return [_from_row(row) for row in rows]
        except (sqlite3.DatabaseError, ValueError, TypeError, KeyError) as error:
            raise StateCorrupt(self.path, f"a row does not read: {error}") from None


class StateCorrupt(ConfigurationError):
    """The state database cannot be read: the agent refuses to start (exit 2) rather
    than forget the sandboxes it holds; ``--recover`` moves it aside (recovery.py)."""

    def __init__(self, path: Path, problem: str) -> None:
        self.path = path
        super().__init__(
            f"the state database {path} cannot be read ({problem}); the sandboxes it "
            "held may still run, unmanaged: start once with --recover to move it aside "
            "and destroy them"
        )


def _to_column(value: Any) -> Any:
    if isinstance(value, NetworkPolicy):
        return wire.encode(value).decode()
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    if isinstance(value, bool):
        return int(value)
    return value


def _from_row(row: tuple[Any, ...]) -> SandboxRecord:
    values = dict(zip(_COLUMNS, row, strict=True))
    values["metadata"] = json.loads(values["metadata"])
    values["env"] = json.loads(values["env"])
    values["network"] = wire.decode(NetworkPolicy, values["network"])
    values["claimed"] = bool(values["claimed"])
    values["hibernated"] = bool(values["hibernated"])
    return SandboxRecord(**values)

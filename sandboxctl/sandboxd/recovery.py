"""``--recover``: start over from a state database that cannot be read.

The database held every sandbox's token, lease and identity; without it none can be
adopted (no client could prove it holds one), so each sandbox of this agent is destroyed.
They are found without the database: every sandbox has its passwd file in the homes dir
(``ID.passwd``, whose group is the sandbox's uid), and every uid it ran as is claimed by
this agent's runtime dir (``uids.py``). Destroying one by id and uid kills its processes,
removes its cgroups (named by its id) and its files. The broken database is kept beside
the new one as ``sandboxd.sqlite.broken-<time>``.

With a database that reads, ``--recover`` does nothing but say so.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sandboxctl.sandboxd.agent import AgentSettings
from sandboxctl.sandboxd.procfs import kill_uid
from sandboxctl.sandboxd.runtime import SIZE_LIMITS, Runtime, RuntimeFailure, SandboxSpec, Size
from sandboxctl.sandboxd.runtimedir import HOMES
from sandboxctl.sandboxd.state import STATE_FILE, StateCorrupt, StateStore
from sandboxctl.sandboxd.uids import UidClaims

log = logging.getLogger("sandboxctl.sandboxd")

KILL_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class Recovery:
    """What ``recover`` did: the file it moved aside (None: the database was fine), the
    sandboxes it destroyed (id, uid) and the uids of no sandbox whose processes it killed."""

    moved_to: Path | None
    destroyed: tuple[tuple[str, int], ...] = ()
    killed_uids: tuple[int, ...] = ()


def recover_agent(settings: AgentSettings, runtime: Runtime) -> Recovery:
    """``recover`` for the agent ``settings`` describe, before it starts."""
    runtime_dir = settings.runtime_dir or settings.state_dir
    claims = UidClaims(settings.uid_claims, runtime_dir) if settings.uid_claims else None
    homes = dict.fromkeys((runtime_dir / HOMES, settings.state_dir / HOMES))
    return recover(settings.state_dir, homes, claims, runtime)


def recover(
    state_dir: Path,
    homes: Iterable[Path],
    claims: UidClaims | None,
    runtime: Runtime,
    now: datetime | None = None,
) -> Recovery:
    """Move an unreadable ``state_dir/sandboxd.sqlite`` aside and destroy the sandboxes
    found in ``homes`` and the uids ``claims`` holds for this agent; each is logged."""
    database = state_dir / STATE_FILE
    if _readable(database):
        log.info("--recover: %s reads: nothing to recover", database)
        return Recovery(None)
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    moved_to = database.with_name(f"{STATE_FILE}.broken-{stamp}")
    for suffix in ("", "-wal", "-shm"):
        if database.with_name(STATE_FILE + suffix).exists():
            os.replace(database.with_name(STATE_FILE + suffix), Path(f"{moved_to}{suffix}"))
    log.warning("--recover: moved the unreadable %s to %s", database, moved_to)
    destroyed: list[tuple[str, int]] = []
    for directory in homes:
        for sandbox_id, uid in _sandboxes_in(directory):
            spec = SandboxSpec(
                id=sandbox_id,
                uid=uid,
                root=Path("/"),
                home=directory / sandbox_id,
                limits=SIZE_LIMITS[Size.SMALL],
            )
            try:
                runtime.destroy(spec, None)
            except RuntimeFailure as error:
                log.error("--recover: could not destroy %s (uid %d): %s", sandbox_id, uid, error)
                continue
            if claims is not None:
                claims.drop(uid)
            destroyed.append((sandbox_id, uid))
            log.warning(
                "--recover: destroyed sandbox %s (uid %d): its state was lost", sandbox_id, uid
            )
    killed: list[int] = []
    for uid in sorted(claims.held() if claims is not None else ()):
        try:
            kill_uid(uid, KILL_TIMEOUT)
        except RuntimeFailure as error:
            log.error("--recover: uid %d: %s", uid, error)
            continue
        assert claims is not None
        claims.drop(uid)
        killed.append(uid)
        log.warning("--recover: killed the processes of uid %d, claimed for no sandbox", uid)
    log.info(
        "--recover: destroyed %d sandboxes and freed %d more uids; starting afresh",
        len(destroyed),
        len(killed),
    )
    return Recovery(moved_to, tuple(destroyed), tuple(killed))


def _readable(database: Path) -> bool:
    if not database.exists():
        return True
    try:
        store = StateStore(database)
    except StateCorrupt:
        return False
    try:
        store.sandboxes()
    except StateCorrupt:
        return False
    finally:
        store.close()
    return True


def _sandboxes_in(directory: Path) -> list[tuple[str, int]]:
    """(id, uid) of every sandbox with a passwd file in ``directory``."""
    found: list[tuple[str, int]] = []
    if not directory.is_dir():
        return found
    for passwd in sorted(directory.glob("*.passwd")):
        try:
            uid = passwd.stat().st_gid  # the file is root's, readable by the sandbox's group
        except FileNotFoundError:
            continue
        if uid > 0:
            found.append((passwd.name.removesuffix(".passwd"), uid))
    return found

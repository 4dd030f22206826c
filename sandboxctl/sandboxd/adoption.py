"""Adoption: taking back what the last agent on this state dir left.

Every sandbox with a row on disk that still runs is adopted (its uid claimed again, its
network re-attached); a dead one is cleaned up. What a start cut short (the agent killed
before the sandbox's row was written) is removed: homes of no sandbox, and uids this
agent claims for none, whose processes are killed. An unreadable database is not adopted
but recovered (``recovery.py``, ``--recover``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from sandboxctl.sandboxd.attachments import Attachments
from sandboxctl.sandboxd.homes import Homes
from sandboxctl.sandboxd.launcher import Launcher, identity
from sandboxctl.sandboxd.state import SandboxRecord, StateStore
from sandboxctl.sandboxd.uids import SandboxUids

log = logging.getLogger("sandboxctl.sandboxd")


@dataclass(frozen=True, slots=True)
class AdoptionReport:
    adopted: tuple[str, ...]
    cleaned: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Adoption:
    state: StateStore
    launcher: Launcher
    uids: SandboxUids
    homes: Homes
    attachments: Attachments

    def adopt(
        self,
        add: Callable[[SandboxRecord], None],
        known: Callable[[], list[SandboxRecord]],
    ) -> AdoptionReport:
        """Hand each live sandbox on disk to ``add``, clean up the dead ones, then
        remove what belongs to none of ``known`` (the agent's sandboxes, adopted ones
        included)."""
        adopted: list[str] = []
        cleaned: list[str] = []
        records = self.state.sandboxes()
        self.homes.find_old(r.id for r in records)
        for record in records:
            if self.launcher.runtime.alive(identity(record)):
                self.uids.claim_adopted(record.id, record.uid)
                add(record)
                adopted.append(record.id)
            elif self.uids.held_elsewhere(record.uid):
                # A row from before uid claims whose uid another agent has taken since:
                # destroying would kill that agent's sandbox. Its own processes are gone.
                log.warning(
                    "dead sandbox %s: its uid %d is another agent's now; forgetting it",
                    record.id,
                    record.uid,
                )
                self.homes.remove(record.id)
                self.state.delete(record.id)
                cleaned.append(record.id)
            else:
                self.launcher.cleanup(record, None)
                cleaned.append(record.id)
        if adopted or cleaned:
            log.info("adopted %d sandboxes, cleaned up %d dead ones", len(adopted), len(cleaned))
        self.attachments.start(known())  # re-attach each one's network, drop what others left
        survivors = known()
        self.homes.remove_others({r.id for r in survivors})
        self.uids.free_orphans(r.uid for r in survivors)
        return AdoptionReport(tuple(adopted), tuple(cleaned))

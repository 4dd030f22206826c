"""Which kit a run acts on: ``local`` (built here, torn down after) or ``external`` (an
operator's deployment named by a file)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path

from sandboxctl.lanes.kit import Kit
from sandboxctl.lanes.model import EXTERNAL, KITS, LOCAL, Lane, LaneError, Progress


def check(kit: str, config: Path | None) -> None:
    """Refuse a kit name or a ``--config`` that does not fit it (one line)."""
    if kit not in KITS:
        raise LaneError(f"--kit {kit!r}: expected one of {', '.join(KITS)}")
    if kit == LOCAL and config is not None:
        raise LaneError("--config names an external kit's file; the local kit needs none")
    if kit == EXTERNAL and config is None:
        raise LaneError("--kit external needs --config FILE (see docs/lanes.md)")


def open_kit(
    kit: str, config: Path | None, lanes: Sequence[Lane], progress: Progress, keep: bool
) -> AbstractContextManager[Kit]:
    """The kit as a context: built or reached on entry, torn down (local, unless ``keep``)
    on exit. An external kit's file is checked against the ``needs`` of ``lanes`` first."""
    check(kit, config)
    if kit == LOCAL:
        from sandboxctl.lanes.local import local_kit

        return local_kit(progress, keep=keep)
    from sandboxctl.lanes.external import external_kit

    return external_kit(config, lanes, progress)

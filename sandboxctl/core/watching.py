"""Watch events as served: their types, their JSON shape, and bookmarks.

The store decides which events a watch sends (``store/watch.py``); this module only says
what one looks like. A BOOKMARK carries no object, only the resourceVersion a client may
resume from; the one that ends a watch's initial events (``sendInitialEvents``) is also
annotated ``k8s.io/initial-events-end: "true"``, which kubectl 1.35 ``wait`` and
``delete`` wait for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from sandboxctl.core.sandboxes import API_VERSION, KIND

ADDED: Final = "ADDED"
MODIFIED: Final = "MODIFIED"
DELETED: Final = "DELETED"
BOOKMARK: Final = "BOOKMARK"

INITIAL_EVENTS_END: Final = "k8s.io/initial-events-end"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One watch event: its type and the object it carries."""

    type: str
    object: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "object": self.object}


def bookmark(resource_version: str, initial_events_end: bool = False) -> WatchEvent:
    """A BOOKMARK at ``resource_version``; ``initial_events_end`` marks the end of the
    initial events of a watch that asked for them."""
    metadata: dict[str, Any] = {"resourceVersion": resource_version}
    if initial_events_end:
        metadata["annotations"] = {INITIAL_EVENTS_END: "true"}
    return WatchEvent(BOOKMARK, {"kind": KIND, "apiVersion": API_VERSION, "metadata": metadata})

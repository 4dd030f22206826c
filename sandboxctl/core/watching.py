"""Watch events as a pure diff between what a watch last sent and what a poll sees now.

A watch opens with one ADDED per object (:func:`opening_burst`), optionally followed by a
BOOKMARK that marks the end of the initial events (:func:`bookmark`). Each poll after that
is compared with the known objects by :func:`diff`, keyed by ``"<namespace>/<name>"``:
a new key is ADDED, a changed ``metadata.resourceVersion`` is MODIFIED, and a key that is
gone is DELETED with the last object sent, unless ``keep`` says the node still holds it
(the pinned watch's check), in which case nothing is sent and the object stays known.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from sandboxctl.core.model import DEFAULT_NAMESPACE
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


def never(key: str, last: dict[str, Any]) -> bool:
    """The default ``keep``: a vanished object is always DELETED."""
    return False


def object_key(obj: Mapping[str, Any]) -> str:
    """``"<namespace>/<name>"`` of a served object; a missing namespace means ``default``."""
    namespace, name = _namespaced_name(obj)
    return f"{namespace}/{name}"


def diff(
    known: Mapping[str, dict[str, Any]],
    current: Mapping[str, dict[str, Any]],
    keep: Callable[[str, dict[str, Any]], bool] = never,
) -> tuple[list[WatchEvent], dict[str, dict[str, Any]]]:
    """The events that take a watcher from ``known`` to ``current``, and the new known map.

    ADDED and MODIFIED come first in the current keys' (namespace, name) order, then
    DELETED in the same order over the vanished keys. ``keep(key, last_object)`` is asked
    only about vanished keys; True sends nothing and keeps the last object known.
    """
    events: list[WatchEvent] = []
    new_known: dict[str, dict[str, Any]] = {}
    for key in sorted(current, key=_key_order):
        obj = current[key]
        new_known[key] = obj
        last = known.get(key)
        if last is None:
            events.append(WatchEvent(ADDED, obj))
        elif _resource_version(last) != _resource_version(obj):
            events.append(WatchEvent(MODIFIED, obj))
    for key in sorted((k for k in known if k not in current), key=_key_order):
        last = known[key]
        if keep(key, last):
            new_known[key] = last
        else:
            events.append(WatchEvent(DELETED, last))
    return events, new_known


def opening_burst(objects: Iterable[dict[str, Any]]) -> list[WatchEvent]:
    """One ADDED per object, in (namespace, name) order: how every watch opens."""
    return [WatchEvent(ADDED, obj) for obj in sorted(objects, key=_namespaced_name)]


def bookmark(resource_version: str) -> WatchEvent:
    """The BOOKMARK that ends the initial events of a watch that asked for them."""
    return WatchEvent(
        BOOKMARK,
        {
            "kind": KIND,
            "apiVersion": API_VERSION,
            "metadata": {
                "resourceVersion": resource_version,
                "annotations": {INITIAL_EVENTS_END: "true"},
            },
        },
    )


def _namespaced_name(obj: Mapping[str, Any]) -> tuple[str, str]:
    metadata = obj.get("metadata") or {}
    return str(metadata.get("namespace") or DEFAULT_NAMESPACE), str(metadata.get("name", ""))


def _key_order(key: str) -> tuple[str, str]:
    # Sort "ns/name" keys as (ns, name), the order a list returns, so "a/x" precedes "a-b/x".
    namespace, _, name = key.partition("/")
    return namespace, name


def _resource_version(obj: Mapping[str, Any]) -> object:
    metadata = obj.get("metadata") or {}
    return metadata.get("resourceVersion")

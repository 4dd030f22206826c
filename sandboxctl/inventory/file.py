"""A file source: NodeInventory objects from a YAML or JSON file, a directory, or stdin.

Accepts single objects, multi-document YAML, a bare array of objects, and the ``List``
that ``kubectl get nodeinventories -o yaml`` prints. A malformed object fails the whole load
with one message naming the file, the object and the field: nothing is half-read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from sandboxctl.clock import Clock, SystemClock
from sandboxctl.core.errors import InventoryFormatError
from sandboxctl.core.model import NodeInventory, inventory_from_object
from sandboxctl.core.snapshot import FleetSnapshot
from sandboxctl.inventory.source import Listener, Subscribers

SUFFIXES = (".yaml", ".yml", ".json")


class _StringTimestampLoader(yaml.SafeLoader):
    """Safe YAML that leaves timestamps as text, as Kubernetes clients do."""


_StringTimestampLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


class FileInventorySource:
    """Reads the inventories once at construction; :meth:`reload` reads them again."""

    def __init__(self, path: Path, clock: Clock | None = None) -> None:
        self.path = path
        self._clock = clock or SystemClock()
        self._snapshot = FleetSnapshot.empty()
        self._subscribers = Subscribers()
        self.reload()

    def snapshot(self) -> FleetSnapshot:
        return self._snapshot

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        return self._subscribers.subscribe(listener)

    def reload(self) -> None:
        inventories = load_path(self.path)
        self._snapshot = FleetSnapshot.build(inventories, self._clock.monotonic())
        self._subscribers.notify()


def load_path(path: Path) -> list[NodeInventory]:
    """Every inventory under ``path`` (a file, or a directory's YAML and JSON files)."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file())
        if not files:
            raise InventoryFormatError("", "no .yaml, .yml or .json files", str(path))
    elif path.exists():
        files = [path]
    else:
        raise InventoryFormatError("", "no such file or directory", str(path))
    inventories: list[NodeInventory] = []
    seen: dict[str, str] = {}
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise InventoryFormatError("", f"cannot read: {error}", str(file)) from error
        for where, inventory in _parse(text, str(file), json_only=file.suffix == ".json"):
            _check_unique(seen, inventory, where)
            inventories.append(inventory)
    return inventories


def load_text(text: str, label: str = "<stdin>") -> list[NodeInventory]:
    """Inventories from YAML or JSON text (JSON is read as YAML)."""
    seen: dict[str, str] = {}
    inventories = []
    for where, inventory in _parse(text, label, json_only=False):
        _check_unique(seen, inventory, where)
        inventories.append(inventory)
    return inventories


def _check_unique(seen: dict[str, str], inventory: NodeInventory, where: str) -> None:
    if inventory.node in seen:
        raise InventoryFormatError(
            "node", f"{inventory.node!r} is already defined at {seen[inventory.node]}", where
        )
    seen[inventory.node] = where


def _parse(text: str, label: str, json_only: bool) -> Iterator[tuple[str, NodeInventory]]:
    documents = _documents(text, label, json_only)
    for doc_index, document in enumerate(documents):
        if document is None:
            continue
        prefix = f"{label}: document {doc_index + 1}" if len(documents) > 1 else label
        for where, obj in _objects(document, prefix):
            try:
                yield where, inventory_from_object(obj)
            except InventoryFormatError as error:
                raise error.located(where) from None


def _documents(text: str, label: str, json_only: bool) -> list[Any]:
    if json_only:
        try:
            return [json.loads(text)] if text.strip() else []
        except json.JSONDecodeError as error:
            raise InventoryFormatError(
                "", f"invalid JSON at line {error.lineno}: {error.msg}", label
            ) from error
    try:
        return list(yaml.load_all(text, Loader=_StringTimestampLoader))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error)
        raise InventoryFormatError("", f"invalid YAML{line}: {problem}", label) from error


def _objects(document: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    if isinstance(document, list):  # a bare array of objects reads like a List's items
        for index, item in enumerate(document):
            yield f"{prefix}: items[{index}]{_node_hint(item)}", item
    elif isinstance(document, dict) and (
        document.get("kind") == "List" or str(document.get("kind", "")).endswith("List")
    ):
        items = document.get("items") or []
        if not isinstance(items, list):
            raise InventoryFormatError("items", "expected a list", prefix)
        for index, item in enumerate(items):
            yield f"{prefix}: items[{index}]{_node_hint(item)}", item
    else:
        yield f"{prefix}: object{_node_hint(document)}", document


def _node_hint(obj: Any) -> str:
    if isinstance(obj, dict):
        metadata = obj.get("metadata")
        node = obj.get("node") or (metadata.get("name") if isinstance(metadata, dict) else None)
        if isinstance(node, str) and node:
            return f" ({node})"
    return ""

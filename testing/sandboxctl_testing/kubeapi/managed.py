"""Field ownership (``metadata.managedFields``) and server-side apply.

Each manager owns a set of field paths. Maps are tracked key by key; every list is one
atomic field (list merge keys are not emulated), as is every scalar. Rules, as the API
server applies them:

* an **apply** sets the manager's set to exactly the fields it sent. A field another
  manager owns with a different value is a conflict (409) unless ``force``, which takes
  it over. A field the manager owned before and no longer sends is removed from the
  object, unless another manager also owns it;
* any other write (**update**: create, PUT, merge or JSON patch) gives the writer the
  fields it changed and takes them from every other manager; it never conflicts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sandboxctl_testing.kubeapi.patches import clone

Path = tuple[str, ...]
SYSTEM_METADATA = frozenset(
    {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "selfLink",
    }
)
_MISSING = object()


class ApplyConflict(Exception):
    def __init__(self, conflicts: list[tuple[str, Path]]) -> None:
        self.conflicts = conflicts
        shown = "\n".join(f'- conflict with "{m}": .{".".join(p)}' for m, p in conflicts)
        noun = "conflict" if len(conflicts) == 1 else "conflicts"
        super().__init__(f"Apply failed with {len(conflicts)} {noun}: {shown.lstrip('- ')}")


@dataclass
class Owner:
    manager: str
    operation: str  # Apply | Update
    api_version: str
    time: str
    subresource: str
    paths: set[Path]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": _tree(self.paths),
        }
        if self.subresource:
            out["subresource"] = self.subresource
        return out


def owners(obj: dict[str, Any]) -> list[Owner]:
    out = []
    for item in (obj.get("metadata") or {}).get("managedFields") or []:
        if not isinstance(item, dict):
            continue
        out.append(
            Owner(
                str(item.get("manager", "")),
                str(item.get("operation", "Update")),
                str(item.get("apiVersion", "")),
                str(item.get("time", "")),
                str(item.get("subresource", "")),
                _paths(item.get("fieldsV1") or {}),
            )
        )
    return out


def section(obj: dict[str, Any], status: bool | None) -> dict[str, Any]:
    """The part of an object a write manages: no system fields; ``status`` True for the
    status subresource only, False for everything but status, None for all."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if key in ("apiVersion", "kind"):
            continue
        if key == "metadata" and isinstance(value, dict):
            kept = {k: v for k, v in value.items() if k not in SYSTEM_METADATA}
            if kept and status is not True:
                out[key] = kept
            continue
        if status is True and key != "status":
            continue
        if status is False and key == "status":
            continue
        out[key] = value
    return out


def leaves(value: Any, prefix: Path = ()) -> set[Path]:
    if isinstance(value, dict) and value:
        out: set[Path] = set()
        for key, item in value.items():
            out |= leaves(item, (*prefix, key))
        return out
    return {prefix} if prefix else set()


def apply(
    current: dict[str, Any],
    applied: dict[str, Any],
    manager: str,
    force: bool,
    status: bool | None,
    api_version: str,
    now: str,
) -> dict[str, Any]:
    """``current`` with ``applied`` server-side applied by ``manager``; ApplyConflict."""
    wanted = section(applied, status)
    new_paths = leaves(wanted)
    subresource = "status" if status else ""
    table = owners(current)
    mine = _entry_of(table, manager, "Apply", subresource)
    others = [owner for owner in table if owner is not mine]
    conflicts = _conflicts(current, wanted, new_paths, others)
    if conflicts and not force:
        raise ApplyConflict(conflicts)
    taken = {p for _, p in conflicts}
    for owner in others:  # forced: the fields change hands
        owner.paths = {p for p in owner.paths if not any(_overlap(p, t) for t in taken)}
    result = clone(current)
    _drop_unapplied(result, (mine.paths if mine else set()) - new_paths, new_paths, others)
    _merge(result, wanted)
    if mine is None:
        mine = Owner(manager, "Apply", api_version, now, subresource, set())
        table.append(mine)
    mine.paths, mine.time, mine.api_version = new_paths, now, api_version
    _store(result, table)
    return result


def _entry_of(table: list[Owner], manager: str, operation: str, subresource: str) -> Owner | None:
    """``manager``'s entry for this operation and subresource, if it has one."""
    key = (manager, operation, subresource)
    return next((o for o in table if (o.manager, o.operation, o.subresource) == key), None)


def _conflicts(
    current: dict[str, Any], wanted: dict[str, Any], paths: set[Path], others: list[Owner]
) -> list[tuple[str, Path]]:
    """(manager, path) for each other manager's first field this apply would change."""
    conflicts: list[tuple[str, Path]] = []
    for owner in others:
        for path in sorted(owner.paths):
            for new in paths:
                if _overlap(path, new) and _at(current, new) != _at(wanted, new):
                    conflicts.append((owner.manager, new))
                    break
    return conflicts


def _drop_unapplied(
    result: dict[str, Any], dropped: set[Path], applied: set[Path], others: list[Owner]
) -> None:
    """Remove the fields the manager applied before and no longer does, unless another
    manager owns them or this apply sets them again."""
    kept = set().union(*(o.paths for o in others))
    for path in sorted(dropped, reverse=True):
        if not any(_overlap(path, other) for other in kept) and not any(
            _overlap(path, new) for new in applied
        ):
            _delete(result, path)


def record_update(
    old: dict[str, Any] | None,
    new: dict[str, Any],
    manager: str,
    status: bool | None,
    api_version: str,
    now: str,
) -> None:
    """Give ``manager`` the fields this write changed in ``new`` (in place)."""
    table = owners(old) if old is not None else []
    before = section(old, status) if old is not None else {}
    after = section(new, status)
    changed = {p for p in leaves(before) | leaves(after) if _at(before, p) != _at(after, p)}
    if not changed:
        _store(new, table)
        return
    subresource = "status" if status else ""
    for owner in table:
        owner.paths = {p for p in owner.paths if not any(_overlap(p, c) for c in changed)}
    mine = _entry_of(table, manager, "Update", subresource)
    if mine is None:
        mine = Owner(manager, "Update", api_version, now, subresource, set())
        table.append(mine)
    mine.paths |= {p for p in changed if _at(after, p) is not _MISSING}
    mine.time = now
    _store(new, table)


def _store(obj: dict[str, Any], table: Iterable[Owner]) -> None:
    entries = [o.to_json() for o in table if o.paths]
    metadata = obj.setdefault("metadata", {})
    if entries:
        metadata["managedFields"] = entries
    else:
        metadata.pop("managedFields", None)


def _overlap(a: Path, b: Path) -> bool:
    shorter = min(len(a), len(b))
    return a[:shorter] == b[:shorter]


def _at(value: Any, path: Path) -> Any:
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return _MISSING
        value = value[key]
    return value


def _delete(obj: dict[str, Any], path: Path) -> None:
    parents = []
    node: Any = obj
    for key in path[:-1]:
        if not isinstance(node, dict) or key not in node:
            return
        parents.append((node, key))
        node = node[key]
    if isinstance(node, dict):
        node.pop(path[-1], None)
    for parent, key in reversed(parents):
        if parent[key] == {}:
            del parent[key]


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict) and value:
            _merge(target[key], value)
        else:
            target[key] = clone(value)


def _tree(paths: set[Path]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for path in sorted(paths):
        node = root
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return root


def _paths(tree: dict[str, Any], prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for key, sub in tree.items():
        if not key.startswith("f:"):
            continue  # "." and k:/v:/i: elements are not emulated
        path = (*prefix, key[2:])
        if isinstance(sub, dict) and any(k.startswith("f:") for k in sub):
            out |= _paths(sub, path)
        else:
            out.add(path)
    return out

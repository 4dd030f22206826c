"""The patch types: JSON merge (RFC 7386), strategic merge (read as a merge: list merge
keys are not emulated) and JSON Patch (RFC 6902). Server-side apply is in ``managed``."""

from __future__ import annotations

import json
from typing import Any, TypeVar, cast

T = TypeVar("T")

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"
APPLY_CBOR = "application/apply-patch+cbor"
TYPES = (JSON_PATCH, MERGE, STRATEGIC, APPLY)


def clone(value: T) -> T:
    """A deep copy of JSON data, several times faster than ``copy.deepcopy`` on it."""
    if isinstance(value, (dict, list)):
        return cast(T, json.loads(json.dumps(value)))
    return value


class PatchError(Exception):
    """A patch that cannot apply: ``status`` 400 (its shape), 422 (a failed test or a
    missing path)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return clone(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def json_patch(document: Any, operations: Any) -> Any:
    """RFC 6902 over a copy of ``document``."""
    if not isinstance(operations, list):
        raise PatchError(400, "a JSON patch must be a JSON array of operations")
    doc = clone(document)
    for index, op in enumerate(operations):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(400, f"JSON patch operation {index} needs 'op' and 'path'")
        kind = op["op"]
        if kind == "add":
            doc = _put(doc, _pointer(op["path"]), clone(op.get("value")), insert=True)
        elif kind == "remove":
            doc, _ = _take(doc, _pointer(op["path"]))
        elif kind == "replace":
            _get(doc, _pointer(op["path"]))
            doc = _put(doc, _pointer(op["path"]), clone(op.get("value")), insert=False)
        elif kind == "test":
            if _get(doc, _pointer(op["path"])) != op.get("value"):
                raise PatchError(
                    422, f"the test operation on {op['path']} failed: the value differs"
                )
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from", ""))
            if kind == "move":
                doc, value = _take(doc, source)
            else:
                value = clone(_get(doc, source))
            doc = _put(doc, _pointer(op["path"]), value, insert=True)
        else:
            raise PatchError(400, f"JSON patch operation {index}: unknown op {kind!r}")
    return doc


def _pointer(text: str) -> list[str]:
    if text == "":
        return []
    if not text.startswith("/"):
        raise PatchError(400, f"invalid JSON pointer {text!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in text[1:].split("/")]


def _get(doc: Any, parts: list[str]) -> Any:
    node = doc
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PatchError(422, f"path /{'/'.join(parts)} does not exist")
    return node


def _put(doc: Any, parts: list[str], value: Any, insert: bool) -> Any:
    if not parts:
        return value
    parent = _get(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-" and insert:
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent) - (0 if insert else 1):
            if insert:
                parent.insert(int(last), value)
            else:
                parent[int(last)] = value
        else:
            raise PatchError(422, f"index {last} is out of range at /{'/'.join(parts[:-1])}")
    else:
        raise PatchError(422, f"/{'/'.join(parts[:-1])} is not an object or array")
    return doc


def _take(doc: Any, parts: list[str]) -> tuple[Any, Any]:
    if not parts:
        raise PatchError(422, "cannot remove the whole document")
    parent = _get(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return doc, parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return doc, parent.pop(int(last))
    raise PatchError(422, f"path /{'/'.join(parts)} does not exist")

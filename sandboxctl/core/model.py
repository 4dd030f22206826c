"""The NodeInventory model: what one node publishes about its pools and live sandboxes.

The Kubernetes object shape (``sandbox.cocoonstack.io/v1beta1``, kind ``NodeInventory``,
camelCase fields) is read by :func:`inventory_from_object` and written by
:func:`inventory_to_object`. Everything else in sandboxctl works on these frozen values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec

from sandboxctl.core.errors import InvalidValueError, InventoryFormatError
from sandboxctl.core.timestamps import ZonedTime, format_rfc3339, parse_rfc3339, parse_stamp

API_VERSION = "sandbox.cocoonstack.io/v1beta1"
KIND = "NodeInventory"
DEFAULT_NET = "none"
DEFAULT_SIZE = "small"
# What a claim's net may be: every agent serves these and nothing else.
NETS = ("none", "egress")
DEFAULT_NAMESPACE = "default"

_Count = Annotated[int, msgspec.Meta(ge=0)]


@dataclass(frozen=True, slots=True, order=True)
class PoolKey:
    """What a claim asks for; ``net`` and ``size`` are compared after defaulting."""

    template: str
    net: str = DEFAULT_NET
    size: str = DEFAULT_SIZE

    @classmethod
    def of(cls, template: str, net: str | None = None, size: str | None = None) -> PoolKey:
        return cls(template, net or DEFAULT_NET, size or DEFAULT_SIZE)

    @property
    def pool(self) -> PoolKey:
        """The warm pool that serves this key. ``net`` is a claim's network policy,
        applied when the sandbox is claimed, not a pool dimension: every sandbox starts
        with a network namespace of its own, so one warm sandbox serves either net."""
        return PoolKey(self.template, DEFAULT_NET, self.size)

    def __str__(self) -> str:
        return f"{self.template}/{self.net}/{self.size}"


@dataclass(frozen=True, slots=True)
class Pool:
    key: PoolKey
    warm: int
    target: int


class Entry(msgspec.Struct, frozen=True, gc=False, rename="camel", omit_defaults=True):
    """One live claim on a node. ``name`` is ``<namespace>/<name>``; no slash means ``default``.

    A struct, not a dataclass, because a republish is mostly entries the reader already
    holds: the wire shape decodes straight into it (times included, in C), equal entries
    compare in C, and the collector never tracks it (it holds no containers), which keeps
    its passes off a fleet of 400,000 entries. The annotations are the wire's rules (a
    decode is then put :func:`in_utc`); what breaks one is for
    :func:`inventory_from_object` to read, or to refuse naming the field."""

    name: Annotated[str, msgspec.Meta(min_length=1)]
    phase: Annotated[str, msgspec.Meta(min_length=1)]
    id: str = ""
    template: str = ""
    claim_ref: str = ""
    addr: str = ""
    deadline: ZonedTime | None = None
    claimed_at: ZonedTime | None = None
    metadata: str = ""
    cpu_count: _Count | None = None
    memory_bytes: _Count | None = None

    @property
    def namespaced_name(self) -> tuple[str, str]:
        return split_name(self.name)


@dataclass(frozen=True, slots=True)
class NodeInventory:
    node: str
    address: str = ""
    pools: tuple[Pool, ...] = ()
    templates: tuple[Mapping[str, Any], ...] = ()
    entries: tuple[Entry, ...] = ()
    published_at: datetime | None = None
    capacity: int | None = None  # most claims at once; None when the node does not say
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


def split_name(name: str) -> tuple[str, str]:
    """``"ns/name"`` -> ``("ns", "name")``; a name without a slash lives in ``default``."""
    namespace, slash, local = name.partition("/")
    if not slash:
        return DEFAULT_NAMESPACE, name
    return namespace, local


# --- reading the object shape -------------------------------------------------------------


def inventory_from_object(obj: object) -> NodeInventory:
    """Read one NodeInventory object; raise InventoryFormatError naming the bad field."""
    body = _mapping(obj, "")
    kind = body.get("kind", KIND)
    if kind != KIND:
        raise InventoryFormatError("kind", f"expected {KIND}, got {kind!r}")
    meta = _mapping(body.get("metadata") or {}, "metadata")
    node = body.get("node")
    if node is None:
        node = meta.get("name")
    node = _required_str(node, "node")
    if meta.get("name") not in (None, node):
        raise InventoryFormatError(
            "metadata.name", f"{meta.get('name')!r} differs from node {node!r}"
        )
    return NodeInventory(
        node=node,
        address=_optional_str(body.get("address"), "address"),
        pools=tuple(_pool(p, f"pools[{i}]") for i, p in enumerate(_list(body, "pools"))),
        templates=tuple(
            _mapping(t, f"templates[{i}]") for i, t in enumerate(_list(body, "templates"))
        ),
        entries=tuple(_entry(e, f"entries[{i}]") for i, e in enumerate(_list(body, "entries"))),
        published_at=parse_stamp(body.get("publishedAt")),
        capacity=_optional_int(body.get("capacity"), "capacity"),
        extra={"metadata": dict(meta)} if meta else {},
    )


def _pool(obj: object, path: str) -> Pool:
    body = _mapping(obj, path)
    key = PoolKey.of(
        _required_str(body.get("template"), f"{path}.template"),
        _optional_str(body.get("net"), f"{path}.net"),
        _optional_str(body.get("size"), f"{path}.size"),
    )
    return Pool(
        key=key,
        warm=_required_int(body.get("warm"), f"{path}.warm"),
        target=_required_int(body.get("target"), f"{path}.target"),
    )


def _entry(obj: object, path: str) -> Entry:
    body = _mapping(obj, path)
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping):
        # Publishers write a JSON string; tolerate an object and keep it deterministic.
        metadata = json.dumps(metadata, sort_keys=True, separators=(",", ":"))
    return Entry(
        name=_required_str(body.get("name"), f"{path}.name"),
        phase=_required_str(body.get("phase"), f"{path}.phase"),
        id=_optional_str(body.get("id"), f"{path}.id"),
        template=_optional_str(body.get("template"), f"{path}.template"),
        claim_ref=_optional_str(body.get("claimRef"), f"{path}.claimRef"),
        addr=_optional_str(body.get("addr"), f"{path}.addr"),
        deadline=_optional_time(body.get("deadline"), f"{path}.deadline"),
        claimed_at=_optional_time(body.get("claimedAt"), f"{path}.claimedAt"),
        metadata=_optional_str(metadata, f"{path}.metadata"),
        cpu_count=_optional_int(body.get("cpuCount"), f"{path}.cpuCount"),
        memory_bytes=_optional_int(body.get("memoryBytes"), f"{path}.memoryBytes"),
    )


def in_utc(entry: Entry) -> Entry:
    """The entry with its times in UTC, as :func:`parse_rfc3339` gives them (the wire may
    carry any offset)."""
    deadline, claimed_at = entry.deadline, entry.claimed_at
    if (deadline is None or deadline.tzinfo is UTC) and (
        claimed_at is None or claimed_at.tzinfo is UTC
    ):
        return entry
    return msgspec.structs.replace(
        entry,
        deadline=deadline and deadline.astimezone(UTC),
        claimed_at=claimed_at and claimed_at.astimezone(UTC),
    )


def _mapping(obj: object, path: str) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        raise InventoryFormatError(path, f"expected an object, got {_kind(obj)}")
    return obj


def _list(body: Mapping[str, Any], name: str) -> list[Any]:
    value = body.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InventoryFormatError(name, f"expected a list, got {_kind(value)}")
    return value


def _required_str(value: object, path: str) -> str:
    if value is None or value == "":
        raise InventoryFormatError(path, "required")
    if not isinstance(value, str):
        raise InventoryFormatError(path, f"expected a string, got {_kind(value)}")
    return value


def _optional_str(value: object, path: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InventoryFormatError(path, f"expected a string, got {_kind(value)}")
    return value


def _required_int(value: object, path: str) -> int:
    if value is None:
        raise InventoryFormatError(path, "required")
    return _int(value, path)


def _optional_int(value: object, path: str) -> int | None:
    return None if value is None else _int(value, path)


def _int(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InventoryFormatError(path, f"expected an integer, got {_kind(value)}")
    if value < 0:
        raise InventoryFormatError(path, f"must not be negative, got {value}")
    return value


def _optional_time(value: object, path: str) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):  # YAML reads unquoted timestamps as datetimes
        value = value.isoformat()
    if not isinstance(value, str):
        raise InventoryFormatError(path, f"expected an RFC 3339 time, got {_kind(value)}")
    try:
        return parse_rfc3339(value)
    except InvalidValueError as error:
        raise InventoryFormatError(path, str(error)) from error


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


# --- writing the object shape -------------------------------------------------------------


def inventory_to_object(inventory: NodeInventory) -> dict[str, Any]:
    """The Kubernetes object for one inventory: camelCase, empty optional fields omitted."""
    metadata = dict(inventory.extra.get("metadata", {}))
    metadata["name"] = inventory.node
    obj: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "node": inventory.node,
    }
    if inventory.address:
        obj["address"] = inventory.address
    obj["pools"] = [
        {
            "template": p.key.template,
            "net": p.key.net,
            "size": p.key.size,
            "warm": p.warm,
            "target": p.target,
        }
        for p in inventory.pools
    ]
    if inventory.templates:
        obj["templates"] = [dict(t) for t in inventory.templates]
    obj["entries"] = [_entry_to_object(e) for e in inventory.entries]
    if inventory.published_at is not None:
        obj["publishedAt"] = format_rfc3339(inventory.published_at)
    if inventory.capacity is not None:
        obj["capacity"] = inventory.capacity
    return obj


def _entry_to_object(entry: Entry) -> dict[str, Any]:
    out: dict[str, Any] = {"name": entry.name, "phase": entry.phase}
    strings = {
        "id": entry.id,
        "template": entry.template,
        "claimRef": entry.claim_ref,
        "addr": entry.addr,
        "metadata": entry.metadata,
    }
    out.update({k: v for k, v in strings.items() if v})
    if entry.deadline is not None:
        out["deadline"] = format_rfc3339(entry.deadline)
    if entry.claimed_at is not None:
        out["claimedAt"] = format_rfc3339(entry.claimed_at)
    if entry.cpu_count is not None:
        out["cpuCount"] = entry.cpu_count
    if entry.memory_bytes is not None:
        out["memoryBytes"] = entry.memory_bytes
    return out

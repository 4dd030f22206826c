"""The NodeInventory model: what one node publishes about its pools and live sandboxes.

The Kubernetes object shape (``sandbox.cocoonstack.io/v1beta1``, kind ``NodeInventory``,
camelCase fields) is read by :func:`inventory_from_object` and written by
:func:`inventory_to_object`, both through the object's typed shape
(:class:`InventoryObject`). Everything else in sandboxctl works on these frozen values.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from sandboxctl.core import names, wire
from sandboxctl.core.errors import InventoryFormatError
from sandboxctl.core.timestamps import ZonedTime, format_rfc3339, parse_stamp
from sandboxctl.core.wire import Count, NonEmpty

API_VERSION: Final = names.NODE_INVENTORIES.api_version
KIND: Final = names.NODE_INVENTORIES.kind
DEFAULT_NET = "none"
DEFAULT_SIZE = "small"
# What a claim's net may be: every agent serves these and nothing else.
NETS = ("none", "egress")
DEFAULT_NAMESPACE = "default"


class PoolKey(msgspec.Struct, frozen=True, order=True):
    """What a claim asks for; ``net`` and ``size`` default when absent or empty (the
    agent API's ``{"template", "net", "size"}``)."""

    template: NonEmpty
    net: str = DEFAULT_NET
    size: str = DEFAULT_SIZE

    def __post_init__(self) -> None:
        if not self.net:
            msgspec.structs.force_setattr(self, "net", DEFAULT_NET)
        if not self.size:
            msgspec.structs.force_setattr(self, "size", DEFAULT_SIZE)

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


class Metadata(Mapping[str, str]):
    """A claim's metadata: string keys to string values, never changed once made.

    A NodeInventory carries it as a JSON object in a string; the agents, the e2b API and
    the store read and write the mapping. Each form is made from the other only when it
    is asked for, and once: a mesh read never writes the JSON, an e2b list never parses
    it. A text that is not a JSON object reads as no values (and is still written as it
    came); a value that is not a string reads as its JSON."""

    __slots__ = ("_text", "_values")

    def __init__(self, values: Mapping[str, str] | None = None, text: str | None = None) -> None:
        self._values = values
        self._text = text

    @classmethod
    def of(cls, values: Mapping[str, str]) -> Metadata:
        """The metadata of a claim: ``values`` are kept, never copied or changed."""
        return cls(values) if values else NO_METADATA

    @classmethod
    def parse(cls, text: str) -> Metadata:
        """The metadata a NodeInventory entry carries as text."""
        return cls(text=text) if text else NO_METADATA

    @property
    def text(self) -> str:
        """The JSON text: as it was read, else the values with sorted keys, compact."""
        if self._text is None:
            values = self._values or {}
            self._text = json.dumps(values, sort_keys=True, separators=(",", ":")) if values else ""
        return self._text

    def _mapping(self) -> Mapping[str, str]:
        if self._values is None:
            self._values = _parsed(self._text or "")
        return self._values

    def __getitem__(self, key: str) -> str:
        return self._mapping()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._mapping())

    def __len__(self) -> int:
        return len(self._mapping())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Metadata):
            if self._text is not None and self._text == other._text:
                return True
            return dict(self._mapping()) == dict(other._mapping())
        return isinstance(other, Mapping) and dict(self._mapping()) == dict(other)

    def __hash__(self) -> int:
        return hash(frozenset(self._mapping().items()))

    def __repr__(self) -> str:
        return f"Metadata({dict(self._mapping())!r})"

    def __wire__(self) -> str:
        return self.text


NO_METADATA: Final = Metadata({}, "")


def _parsed(text: str) -> Mapping[str, str]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in value.items()}


def read_metadata(kind: type, value: object) -> Metadata:
    """msgspec's hook for an entry's ``metadata``: the text publishers write, or an object
    (tolerated: written back as its sorted JSON)."""
    if kind is not Metadata:
        raise NotImplementedError(kind)
    if isinstance(value, str):
        return Metadata.parse(value)
    if isinstance(value, dict):
        return Metadata.parse(json.dumps(value, sort_keys=True, separators=(",", ":")))
    raise TypeError(f"expected a string, got {wire.kind_of(value)}")


class Entry(msgspec.Struct, frozen=True, gc=False, rename="camel", omit_defaults=True):
    """One live claim on a node. ``name`` is ``<namespace>/<name>``; no slash means ``default``.

    A struct, not a dataclass, because a republish is mostly entries the reader already
    holds: the wire shape decodes straight into it (times included, in C), equal entries
    compare in C, and the collector never tracks it, which keeps its passes off a fleet
    of 400,000 entries. The annotations are the wire's rules (a decode is then put
    :func:`in_utc`); what breaks one is for :func:`inventory_from_object` to read, or to
    refuse naming the field. Decoding it needs :func:`read_metadata` as the hook."""

    name: NonEmpty
    phase: NonEmpty
    id: str = ""
    template: str = ""
    claim_ref: str = ""
    addr: str = ""
    metadata: Metadata = NO_METADATA
    deadline: ZonedTime | None = None
    claimed_at: ZonedTime | None = None
    cpu_count: Count | None = None
    memory_bytes: Count | None = None

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


# --- the object shape -----------------------------------------------------------------------


class PoolObject(msgspec.Struct, frozen=True, kw_only=True):
    """One pool as a NodeInventory lists it: the key's fields, then the counts."""

    template: NonEmpty
    net: str = ""
    size: str = ""
    warm: Count
    target: Count


class InventoryObject(msgspec.Struct, frozen=True, rename="camel"):
    """A NodeInventory object as publishers write it. ``node`` may be left to
    ``metadata.name``; an unparsable ``publishedAt`` reads as unstamped (``parse_stamp``);
    ``templates`` are kept as the objects they are."""

    kind: str = KIND
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    node: str = ""
    address: str = ""
    pools: tuple[PoolObject, ...] = ()
    templates: tuple[dict[str, Any], ...] = ()
    entries: tuple[Entry, ...] = ()
    published_at: Any = None
    capacity: Count | None = None


def inventory_from_object(obj: object) -> NodeInventory:
    """Read one NodeInventory object; raise InventoryFormatError naming the bad field."""
    try:
        body = wire.decode(InventoryObject, obj, dec_hook=read_metadata)
    except wire.WireError as error:
        raise InventoryFormatError(error.field, error.problem) from None
    if body.kind != KIND:
        raise InventoryFormatError("kind", f"expected {KIND}, got {body.kind!r}")
    named = body.metadata.get("name")
    node = body.node or named
    if not node:
        raise InventoryFormatError("node", "required")
    if not isinstance(node, str):
        raise InventoryFormatError("node", f"expected a string, got {wire.kind_of(node)}")
    if named not in (None, node):
        raise InventoryFormatError("metadata.name", f"{named!r} differs from node {node!r}")
    return NodeInventory(
        node=node,
        address=body.address,
        pools=tuple(
            Pool(PoolKey.of(p.template, p.net, p.size), warm=p.warm, target=p.target)
            for p in body.pools
        ),
        templates=body.templates,
        entries=_in_utc(body.entries),
        published_at=parse_stamp(body.published_at),
        capacity=body.capacity,
        extra={"metadata": body.metadata} if body.metadata else {},
    )


def _in_utc(entries: tuple[Entry, ...]) -> tuple[Entry, ...]:
    """Every entry :func:`in_utc`; a time that is out of range in UTC names its field."""
    kept = []
    for i, entry in enumerate(entries):
        try:
            kept.append(in_utc(entry))
        except OverflowError:
            field = "deadline" if _beyond_utc(entry.deadline) else "claimedAt"
            raise InventoryFormatError(f"entries[{i}].{field}", "out of range in UTC") from None
    return tuple(kept)


def _beyond_utc(at: datetime | None) -> bool:
    try:
        return at is not None and at.astimezone(UTC) is None
    except OverflowError:
        return True


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
    obj["entries"] = wire.plain(inventory.entries)
    if inventory.published_at is not None:
        obj["publishedAt"] = format_rfc3339(inventory.published_at)
    if inventory.capacity is not None:
        obj["capacity"] = inventory.capacity
    return obj

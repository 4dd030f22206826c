"""The one mapping from a sandboxd agent's answers to the inventory model.

Mesh mode, a publisher and the store's live lookups all read the same two answers
(``GET /v1/info`` and the rows of ``GET /v1/sandboxes``); this module is the only place
that turns them into :class:`NodeInventory`, :class:`Pool` and :class:`Entry` values, so
every reader sees one sandbox the same way.

An answer that breaks the agent's API raises :class:`AgentAnswerError` naming the field
(``info.pools[0].warm``, ``sandboxes[3].key.template``); nothing is half-read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sandboxctl.core.errors import InvalidValueError, SandboxctlError
from sandboxctl.core.model import Entry, NodeInventory, Pool, PoolKey
from sandboxctl.core.timestamps import parse_rfc3339

RUNNING = "Running"
HIBERNATED = "Hibernated"


class AgentAnswerError(SandboxctlError):
    """An agent's answer that does not fit its API; ``field`` is the dotted path in it.

    ``address`` names the agent when the caller knows it (see :meth:`at`).
    """

    def __init__(self, field: str, problem: str, address: str = "") -> None:
        self.field = field
        self.problem = problem
        self.address = address
        place = f"sandboxd {address}: " if address else ""
        named = f"{field}: " if field else ""
        super().__init__(f"{place}{named}{problem}")

    def at(self, address: str) -> AgentAnswerError:
        """The same error, naming the agent that gave the answer."""
        return AgentAnswerError(self.field, self.problem, address)


def entry_from_row(row: Mapping[str, Any]) -> Entry:
    """One ``GET /v1/sandboxes`` row as an inventory entry.

    ``name`` (and ``claim_ref``) is the row's ``claim_ref``, or its id when that is empty;
    a hibernated (or archived) row is ``Hibernated``, any other ``Running``; ``metadata``
    becomes a deterministic JSON string, ``""`` when there is none.
    """
    return _entry(row, "")


def pools_from_info(info: Mapping[str, Any]) -> tuple[Pool, ...]:
    """The warm pools a ``GET /v1/info`` answer reports, in the agent's order."""
    body = _mapping(info, "info")
    pools = _optional_list(body.get("pools"), "info.pools")
    return tuple(_pool(pool, f"info.pools[{i}]") for i, pool in enumerate(pools))


def inventory_from_agent(
    info: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], published_at: datetime
) -> NodeInventory:
    """One node's inventory from its info answer and its sandbox rows.

    ``node`` is ``info["node"]``, ``address`` its ``advertise_addr`` (both required);
    entries are sorted by name (then id). ``published_at`` is stamped by the caller: the
    time it received the answers.
    """
    if published_at.tzinfo is None:
        raise InvalidValueError("published_at needs a zone: pass an aware UTC datetime")
    body = _mapping(info, "info")
    node = _required_str(body.get("node"), "info.node")
    address = _required_str(body.get("advertise_addr"), "info.advertise_addr")
    pools = pools_from_info(body)
    if isinstance(rows, str | bytes) or not isinstance(rows, Sequence):
        raise AgentAnswerError("sandboxes", f"expected a list, got {_kind(rows)}")
    entries = [_entry(row, f"sandboxes[{i}]") for i, row in enumerate(rows)]
    entries.sort(key=lambda entry: (entry.name, entry.id))
    return NodeInventory(
        node=node,
        address=address,
        pools=pools,
        entries=tuple(entries),
        published_at=published_at,
    )


# --- one row ------------------------------------------------------------------------------


def _entry(row: object, path: str) -> Entry:
    body = _mapping(row, path)
    sandbox_id = _required_str(body.get("id"), _at(path, "id"))
    key = _mapping(body.get("key"), _at(path, "key"))
    template = _required_str(key.get("template"), _at(path, "key.template"))
    claim_ref = _optional_str(body.get("claim_ref"), _at(path, "claim_ref"))
    paused = _optional_bool(body.get("hibernated"), _at(path, "hibernated")) or _optional_bool(
        body.get("archived"), _at(path, "archived")
    )
    name = claim_ref or sandbox_id
    return Entry(
        name=name,
        phase=HIBERNATED if paused else RUNNING,
        id=sandbox_id,
        template=template,
        claim_ref=name,
        deadline=_optional_time(body.get("deadline"), _at(path, "deadline")),
        claimed_at=_optional_time(body.get("claimed_at"), _at(path, "claimed_at")),
        metadata=_metadata(body.get("metadata"), _at(path, "metadata")),
        cpu_count=_optional_int(body.get("cpu_count"), _at(path, "cpu_count")),
        memory_bytes=_optional_int(body.get("mem_total_bytes"), _at(path, "mem_total_bytes")),
    )


def _pool(obj: object, path: str) -> Pool:
    body = _mapping(obj, path)
    key = _mapping(body.get("key"), f"{path}.key")
    return Pool(
        key=PoolKey.of(
            _required_str(key.get("template"), f"{path}.key.template"),
            _optional_str(key.get("net"), f"{path}.key.net"),
            _optional_str(key.get("size"), f"{path}.key.size"),
        ),
        warm=_required_int(body.get("warm"), f"{path}.warm"),
        target=_required_int(body.get("target"), f"{path}.target"),
    )


def _metadata(value: object, path: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, Mapping):
        raise AgentAnswerError(path, f"expected an object, got {_kind(value)}")
    if not value:
        return ""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# --- field readers --------------------------------------------------------------------------


def _at(path: str, field: str) -> str:
    return f"{path}.{field}" if path else field


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _mapping(value: object, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise AgentAnswerError(path, f"expected an object, got {_kind(value)}")
    return value


def _optional_list(value: object, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise AgentAnswerError(path, f"expected a list, got {_kind(value)}")
    return value


def _required_str(value: object, path: str) -> str:
    if value is None or value == "":
        raise AgentAnswerError(path, "required")
    if not isinstance(value, str):
        raise AgentAnswerError(path, f"expected a string, got {_kind(value)}")
    return value


def _optional_str(value: object, path: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise AgentAnswerError(path, f"expected a string, got {_kind(value)}")
    return value


def _optional_bool(value: object, path: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise AgentAnswerError(path, f"expected true or false, got {_kind(value)}")
    return value


def _required_int(value: object, path: str) -> int:
    if value is None:
        raise AgentAnswerError(path, "required")
    return _int(value, path)


def _optional_int(value: object, path: str) -> int | None:
    return None if value is None else _int(value, path)


def _int(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise AgentAnswerError(path, f"expected an integer, got {_kind(value)}")
    if value < 0:
        raise AgentAnswerError(path, f"must not be negative, got {value}")
    return value


def _optional_time(value: object, path: str) -> datetime | None:
    """An RFC 3339 time; absent, null, empty or Go's zero time all mean none."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise AgentAnswerError(path, f"expected an RFC 3339 time, got {_kind(value)}")
    try:
        parsed = parse_rfc3339(value)
    except InvalidValueError as error:
        raise AgentAnswerError(path, str(error)) from error
    return None if parsed.year == 1 else parsed

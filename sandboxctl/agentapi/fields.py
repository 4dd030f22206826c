"""Reading one JSON value of the agent API, naming the field when it does not fit.

Every reader takes the dotted path of the value (``info.pools[0].warm``) and raises
:class:`AgentAnswerError` with it, so a bad answer points at the exact place to fix.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

from sandboxctl.agentapi.errors import AgentAnswerError
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.model import PoolKey
from sandboxctl.core.timestamps import format_rfc3339, parse_rfc3339


def at(path: str, field: str) -> str:
    return f"{path}.{field}" if path else field


def kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def read_object(value: object, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise AgentAnswerError(path, f"expected an object, got {kind(value)}")
    return value


def refuse_unknown(body: Mapping[str, Any], known: Collection[str], path: str) -> None:
    """Request bodies are read strictly: a misspelt field is an error, not a default."""
    for name in body:
        if name not in known:
            raise AgentAnswerError(at(path, name), "unknown field")


def optional_list(value: object, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise AgentAnswerError(path, f"expected a list, got {kind(value)}")
    return value


def required_list(value: object, path: str) -> list[Any]:
    if value is None:
        raise AgentAnswerError(path, "required")
    return optional_list(value, path)


def required_str(value: object, path: str) -> str:
    if value is None or value == "":
        raise AgentAnswerError(path, "required")
    return optional_str(value, path)


def optional_str(value: object, path: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise AgentAnswerError(path, f"expected a string, got {kind(value)}")
    return value


def nullable_str(value: object, path: str) -> str | None:
    return None if value is None else optional_str(value, path)


def optional_bool(value: object, path: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise AgentAnswerError(path, f"expected true or false, got {kind(value)}")
    return value


def required_int(value: object, path: str) -> int:
    if value is None:
        raise AgentAnswerError(path, "required")
    return count(value, path)


def optional_int(value: object, path: str) -> int | None:
    return None if value is None else count(value, path)


def count(value: object, path: str) -> int:
    """A non-negative integer; ``true`` and ``"5"`` are not integers."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise AgentAnswerError(path, f"expected an integer, got {kind(value)}")
    if value < 0:
        raise AgentAnswerError(path, f"must not be negative, got {value}")
    return value


def required_number(value: object, path: str) -> float:
    """A non-negative number, integer or not (``true`` is not a number)."""
    if value is None:
        raise AgentAnswerError(path, "required")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AgentAnswerError(path, f"expected a number, got {kind(value)}")
    if value < 0:
        raise AgentAnswerError(path, f"must not be negative, got {value}")
    return float(value)


def string_map(value: object, path: str) -> dict[str, str]:
    """An object of string values (metadata, env). A message never repeats a value: env
    values may be secrets."""
    body = {} if value is None else read_object(value, path)
    for name, item in body.items():
        if not isinstance(item, str):
            raise AgentAnswerError(at(path, name), f"expected a string, got {kind(item)}")
    return dict(body)


def optional_time(value: object, path: str) -> datetime | None:
    """An RFC 3339 time; absent, null, empty or Go's zero time all mean none."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise AgentAnswerError(path, f"expected an RFC 3339 time, got {kind(value)}")
    try:
        parsed = parse_rfc3339(value)
    except InvalidValueError as error:
        raise AgentAnswerError(path, str(error)) from error
    return None if parsed.year == 1 else parsed


def time_json(value: datetime | None) -> str | None:
    """A time as the agent writes it: UTC, second precision, ``Z``."""
    return None if value is None else format_rfc3339(value)


def pool_key(value: object, path: str) -> PoolKey:
    """``{"template", "net", "size"}``; ``net`` and ``size`` default as a claim's do."""
    key = read_object(value, path)
    return PoolKey.of(
        required_str(key.get("template"), f"{path}.template"),
        optional_str(key.get("net"), f"{path}.net"),
        optional_str(key.get("size"), f"{path}.size"),
    )


def pool_key_json(key: PoolKey) -> dict[str, str]:
    return {"template": key.template, "net": key.net, "size": key.size}

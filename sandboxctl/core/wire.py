"""The wire's typed shapes: one decoder, one encoder and one error for every JSON body.

Every body sandboxctl reads or writes (the host agent's API, NodeInventory objects, the
e2b API, the Sandbox API) is a msgspec Struct, read by :func:`decode` (in C) and written
by :func:`encode`. The rules every shape shares are written here, once:

* a null where a field cannot hold null is the field left out (its default, or
  "required"): Go writes a nil map or slice as null, and every reader here has always
  read a null as absent;
* an empty string where a time is expected is no time;
* a body that does not fit raises :class:`WireError` naming the field by its dotted path
  (``pools[0].warm``) in plain words (``expected an integer, got str``); no message
  repeats a string value (metadata and env values may be secrets);
* times are written in UTC at second precision with ``Z``, as Kubernetes writes them,
  and the bytes are those Python's own JSON writer gives (compact, UTF-8).

A shape the JSON fits fast (every well-formed body) is decoded once, in C; the rules
above cost a second, Python-level pass only for a body that breaks one.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Final, TypeVar

import msgspec
import msgspec.inspect as types

from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.timestamps import format_rfc3339

T = TypeVar("T")
M = TypeVar("M", bound="Model")
DecHook = Callable[[type, Any], Any]

# The rules of fields most shapes share.
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]  # a string that must be given
Count = Annotated[int, msgspec.Meta(ge=0)]  # a whole number from 0 up


class WireError(InvalidValueError):
    """A body that does not fit its shape: ``field`` is the dotted path of the value
    (empty for the body itself), ``problem`` what is wrong with it."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}" if field else problem)


class NotJson(WireError):
    """Bytes that are not JSON at all (or nest too deeply to read: ``TOO_DEEP``)."""


TOO_DEEP: Final = "nested too deeply"


class Model(msgspec.Struct, frozen=True):
    """A body's typed shape. ``ROOT`` names the body in the fields of its errors (an
    agent's ``info.pools[0].warm``)."""

    ROOT: ClassVar[str] = ""

    @classmethod
    def from_json(cls: type[M], data: bytes | str | object) -> M:
        """The shape read from JSON bytes or text, or from plain values (a dict)."""
        return decode(cls, data, root=cls.ROOT)


def decode(
    shape: type[T],
    data: object,
    *,
    root: str = "",
    dec_hook: DecHook | None = None,
) -> T:
    """``data`` (JSON bytes or text, else plain values such as YAML gives) read as
    ``shape``; :class:`WireError` naming the field when it does not fit."""
    raw = isinstance(data, bytes | bytearray | memoryview | str)
    key: Any = shape  # a type: hashable, whatever its annotation
    try:
        if isinstance(data, bytes | bytearray | memoryview | str):
            found: T = _decoder(key, dec_hook).decode(data)
            return found
        return msgspec.convert(data, shape, dec_hook=dec_hook)
    except msgspec.ValidationError:
        pass  # the rules above may yet make it fit: the slow path
    except (msgspec.DecodeError, RecursionError) as error:
        raise _not_json(error) from None
    plain = json_value(data) if raw else data
    info = _info(key)
    plain = _lenient(plain, info)
    try:
        return msgspec.convert(plain, shape, dec_hook=dec_hook)
    except msgspec.ValidationError as error:
        field, problem = _explain(str(error), plain, info)
        raise WireError(_join(root, field), problem) from None
    except RecursionError as error:
        raise _not_json(error) from None


def json_value(data: object) -> Any:
    """JSON bytes or text as plain values; :class:`NotJson` when they are not JSON."""
    try:
        return msgspec.json.decode(data)  # type: ignore[call-overload]
    except (msgspec.DecodeError, RecursionError) as error:
        raise _not_json(error) from None


def encode(value: object) -> bytes:
    """``value`` (shapes, dicts, lists, times) as the JSON bytes every API answers."""
    return _dumps(value).encode()


def encode_listing(value: object) -> bytes:
    """The bytes :func:`encode` writes, by msgspec's own encoder (about 50 times faster),
    for the list answers that are hot paths. Only for shapes whose times are all UTC at
    whole seconds (:func:`whole_seconds`) and that hold no float: msgspec writes a time's
    fraction and zone, and some floats, as Python does not."""
    return msgspec.json.encode(value)


def whole_seconds(value: datetime) -> datetime:
    """``value`` in UTC without its fraction: the time :func:`encode` writes."""
    return value.astimezone(UTC).replace(microsecond=0)


def plain(value: object) -> Any:
    """``value`` as plain JSON values (dicts, lists, strings...), times written as
    :func:`encode` writes them: for a client that serializes on its own."""
    return msgspec.json.decode(encode(value))


def _builtin(value: object) -> Any:
    """What Python's JSON writer cannot write itself, as it is written on the wire."""
    if isinstance(value, datetime):
        return format_rfc3339(value)
    if isinstance(value, msgspec.Struct):
        return msgspec.to_builtins(value, builtin_types=(datetime,), enc_hook=_builtin)
    wire = getattr(value, "__wire__", None)
    if wire is not None:  # a value with a wire form of its own (core.model.Metadata)
        return wire()
    raise TypeError(f"{type(value).__name__} has no JSON form")


_dumps = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_builtin
).encode


@functools.cache
def _decoder(shape: Any, dec_hook: DecHook | None) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(shape, dec_hook=dec_hook)


@functools.cache
def _info(shape: Any) -> types.Type:
    return types.type_info(shape)


def kind_of(value: object) -> str:
    """A plain value's kind, as messages name it (``null``, ``dict``, ``list``, ``str``...)."""
    return "null" if value is None else type(value).__name__


def _not_json(error: Exception) -> NotJson:
    if isinstance(error, RecursionError):
        return NotJson("", TOO_DEEP)
    return NotJson("", str(error))


# --- the rules a body may break and still be read ---------------------------------------


def _lenient(value: Any, info: types.Type) -> Any:
    """``value`` with a null left out where its field cannot hold one, and an empty
    string left out where a time is expected (copies; ``value`` is not changed)."""
    if isinstance(info, types.UnionType):
        info = _branch(value, info)
    if isinstance(info, types.StructType) and isinstance(value, dict):
        fields = {field.encode_name: field.type for field in info.fields}
        kept: dict[Any, Any] = {}
        for name, item in value.items():
            kind = fields.get(name)
            if kind is not None and _absent(item, kind):
                continue
            kept[name] = item if kind is None else _lenient(item, kind)
        return kept
    listed = types.ListType | types.VarTupleType | types.SetType | types.FrozenSetType
    if isinstance(info, listed) and isinstance(value, list):
        return [_lenient(item, info.item_type) for item in value]
    if isinstance(info, types.DictType) and isinstance(value, dict):
        return {key: _lenient(item, info.value_type) for key, item in value.items()}
    return value


def _absent(value: Any, info: types.Type) -> bool:
    if value is None:
        return not _takes(info, types.NoneType)
    return value == "" and _takes(info, types.DateTimeType)


def _takes(info: types.Type, kind: type[types.Type]) -> bool:
    if isinstance(info, types.UnionType):
        return any(isinstance(t, kind) for t in info.types)
    return isinstance(info, kind)


def _branch(value: Any, union: types.UnionType) -> types.Type:
    """The member of a union a value is read as (an object: the struct or mapping)."""
    wanted: tuple[type[types.Type], ...] = ()
    if isinstance(value, dict):
        wanted = (types.StructType, types.DictType)
    elif isinstance(value, list):
        wanted = (types.ListType, types.VarTupleType)
    for member in union.types:
        if isinstance(member, wanted):
            return member
    return union


# --- naming what does not fit -----------------------------------------------------------

_AT = re.compile(r"^(?P<problem>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_PART = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_EXPECTED = re.compile(r"^Expected `(?P<want>[^`]+)`, got `(?P<got>[^`]+)`$")
_BOUND = re.compile(r"^Expected `(?P<want>[^`]+)` (?P<op>>=|<=|>|<) (?P<bound>[-\d.e]+)$")
_LENGTH = re.compile(r"^Expected `(?P<want>[^`]+)` of length (?P<op>>=|<=) (?P<bound>\d+)$")
_FIELD = re.compile(r"^Object (?P<what>missing required|contains unknown) field `(?P<name>[^`]+)`$")
_WORDS = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "object": "an object",
    "array": "a list",
    "datetime": "an RFC 3339 time",
}
_KINDS = {"object": "dict", "array": "list"}  # as readers here have always named them
_OWN = re.compile(r"^(?P<name>[A-Za-z_]\w*): (?P<problem>.+)$", re.DOTALL)


def _explain(message: str, value: Any, info: types.Type) -> tuple[str, str]:
    """msgspec's message as (dotted field, problem in the words of this project)."""
    match = _AT.match(message)
    assert match is not None  # the pattern matches any text
    problem = match["problem"]
    steps = _steps(match["path"] or "", value, problem)
    found = _value_at(value, steps)
    if field := _FIELD.match(problem):
        steps.append(field["name"])
        if field["what"] == "contains unknown":
            return _dotted(steps), "unknown field"
        holds = _type_at(info, steps)
        if isinstance(holds, types.StructType | types.DictType):
            return _dotted(steps), "expected an object, got null"
        return _dotted(steps), "required"
    if own := _OWN.match(problem):  # a shape's own check, naming one of its fields
        return _dotted([*steps, own["name"]]), own["problem"]
    return _dotted(steps), _problem(problem, found)


def _problem(problem: str, found: Any) -> str:
    if expected := _EXPECTED.match(problem):
        wanted = [part for part in expected["want"].split(" | ") if part != "null"]
        words = " or ".join(_WORDS.get(part, part) for part in wanted) or "null"
        return f"expected {words}, got {_KINDS.get(expected['got'], expected['got'])}"
    if bound := _BOUND.match(problem):
        if bound["op"] == ">=" and bound["bound"] == "0":
            return f"must not be negative, got {found}"
        least = bound["op"] in (">=", ">")
        return f"must be {'at least' if least else 'at most'} {bound['bound']}, got {found}"
    if length := _LENGTH.match(problem):
        if length["op"] == ">=" and length["bound"] == "1":
            return "required"
        unit = "characters" if length["want"] == "str" else "entries"
        least = length["op"] == ">="
        return f"{'at least' if least else 'at most'} {length['bound']} {unit}"
    if problem == "Invalid RFC3339 encoded datetime":
        return f"invalid timestamp {found!r}: expected RFC 3339"
    if problem == "Expected `datetime` with a timezone component":
        return f"invalid timestamp {found!r}: RFC 3339 needs a zone such as Z"
    return problem  # a shape's own check (its __post_init__), in its own words


def _steps(path: str, value: Any, problem: str) -> list[str | int]:
    """The path's steps; a mapping's ``[...]`` becomes the key whose value broke it (the
    first whose kind is the one the problem names, else the first)."""
    steps: list[str | int] = []
    for name, index in _PART.findall(path):
        if name:
            steps.append(name)
        elif index != "...":
            steps.append(int(index))
        else:
            steps.append(_offending_key(_value_at(value, steps), problem))
    return steps


def _offending_key(mapping: Any, problem: str) -> str:
    if not isinstance(mapping, dict) or not mapping:
        return "..."
    expected = _EXPECTED.match(problem)
    if expected is not None:
        for key, item in mapping.items():
            if _kind(item) == expected["got"]:
                return str(key)
    return str(next(iter(mapping)))


def _kind(value: Any) -> str:
    """msgspec's name of a plain JSON value's kind."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return type(value).__name__


def _value_at(value: Any, steps: list[str | int]) -> Any:
    for step in steps:
        if isinstance(step, int) and isinstance(value, list) and step < len(value):
            value = value[step]
        elif isinstance(step, str) and isinstance(value, dict):
            value = value.get(step)
        else:
            return None
    return value


def _type_at(info: types.Type, steps: list[str | int]) -> types.Type | None:
    for step in steps:
        if isinstance(info, types.UnionType):
            info = next((t for t in info.types if not isinstance(t, types.NoneType)), info)
        if isinstance(step, str) and isinstance(info, types.StructType):
            named = [f.type for f in info.fields if f.encode_name == step]
            if not named:
                return None
            info = named[0]
        elif isinstance(step, str) and isinstance(info, types.DictType):
            info = info.value_type
        elif isinstance(step, int) and isinstance(info, types.ListType | types.VarTupleType):
            info = info.item_type
        else:
            return None
    if isinstance(info, types.UnionType):
        info = next((t for t in info.types if not isinstance(t, types.NoneType)), info)
    return info


def _dotted(steps: list[str | int]) -> str:
    text = ""
    for step in steps:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text


def _join(root: str, field: str) -> str:
    if not root or not field:
        return root or field
    return f"{root}{field}" if field.startswith("[") else f"{root}.{field}"

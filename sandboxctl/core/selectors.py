"""Kubernetes label and field selectors, parsed and matched as the API server does.

Label selectors follow ``k8s.io/apimachinery/pkg/labels.Parse`` token for token::

    selector    := requirement ("," requirement)*  |  ""
    requirement := ["!"] KEY
                 | KEY ("=" | "==" | "!=") [VALUE]
                 | KEY ("in" | "notin") "(" [VALUE] ("," [VALUE])* ")"
                 | KEY (">" | "<") INTEGER

Whitespace (space, tab, CR, LF) may separate any two tokens and is needed only between a
key and ``in``/``notin``. ``in`` and ``notin`` are keywords only where an operator is
expected, so ``in in (in)`` is a valid selector. A missing value means the empty value
(``a=`` and ``a in ()`` both require ``a`` to be present and empty). ``!=`` and ``notin``
match objects that lack the key; ``>`` and ``<`` need the key with an integer value. Even
the lexer's quirks are kept: as in Go, a NUL character between tokens ends the text and one
inside a token ends that token.

Field selectors follow ``k8s.io/apimachinery/pkg/fields.ParseSelector``: comma-separated
``field=value``, ``field==value`` or ``field!=value`` terms, nothing trimmed, split at the
first operator; in a value ``\\,``, ``\\=`` and ``\\\\`` stand for ``,``, ``=`` and ``\\``, and an
unescaped ``,`` or ``=`` is an error. A field the object lacks reads as the empty string.
Unlike the API server, which checks fields per resource after parsing, ``FieldSelector.parse``
takes the allowed fields and refuses any other with ``UnsupportedFieldError``.

``str()`` of either selector is canonical: requirements sorted, ``==`` written ``=``, value
lists sorted and deduplicated; parsing it gives back an equal selector.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from sandboxctl.core.errors import InvalidValueError

__all__ = [
    "SANDBOX_FIELDS",
    "FieldRequirement",
    "FieldSelector",
    "LabelRequirement",
    "LabelSelector",
    "Operator",
    "UnsupportedFieldError",
]

#: The fields a sandbox list can be filtered on, and ``FieldSelector.parse``'s default.
SANDBOX_FIELDS: frozenset[str] = frozenset(
    {"metadata.name", "metadata.namespace", "status.nodeName"}
)


class Operator(enum.StrEnum):
    """How a requirement relates its key to its values (``selection.Operator`` spellings).

    ``==`` parses to ``EQUALS``: Kubernetes treats the two identically.
    """

    EQUALS = "="
    NOT_EQUALS = "!="
    IN = "in"
    NOT_IN = "notin"
    EXISTS = "exists"
    DOES_NOT_EXIST = "!"
    GREATER_THAN = "gt"
    LESS_THAN = "lt"

    @classmethod
    def _missing_(cls, value: object) -> Operator | None:
        return cls.EQUALS if value == "==" else None


class UnsupportedFieldError(InvalidValueError):
    """A field selector names a field the resource cannot be filtered on."""

    def __init__(
        self,
        field: str,
        resource: str = "sandboxes",
        allowed: AbstractSet[str] = frozenset(),
    ) -> None:
        self.field = field
        self.resource = resource
        self.allowed = frozenset(allowed)
        super().__init__(f"field selector {_quote(field)} is not supported on {resource}")


# --- validation (k8s.io/apimachinery/pkg/util/validation) ---------------------------------

_NAME_MAX = 63
_PREFIX_MAX = 253
_VALUE_MAX = 63
_NAME = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(
    r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
)
_GO_INT = re.compile(r"[+-]?[0-9]+")
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_NAME_RULE = "letters, digits, '-', '_' and '.', starting and ending with a letter or digit"


def _quote(text: str) -> str:
    """``text`` in double quotes as typed, with only unprintable characters escaped."""
    shown = "".join(
        ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text
    )
    return f'"{shown}"'


def _key_problem(key: str) -> str | None:
    """Why ``key`` is not a qualified name (``[prefix/]name``), or None when it is."""
    parts = key.split("/")
    if len(parts) > 2:
        return (
            f"key {_quote(key)} has more than one '/'; a key is a name with an optional "
            "DNS subdomain prefix, e.g. my-label or example.com/my-label"
        )
    if len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return f"key {_quote(key)} has an empty prefix before '/'"
        if len(prefix) > _PREFIX_MAX:
            return f"the prefix of key {_quote(key)} is longer than {_PREFIX_MAX} characters"
        if not _DNS_SUBDOMAIN.fullmatch(prefix):
            return (
                f"the prefix {_quote(prefix)} of key {_quote(key)} is not a DNS subdomain: "
                "use lowercase letters, digits, '-' and '.', starting and ending with a "
                "letter or digit, e.g. example.com"
            )
        subject = f"the name {_quote(name)} of key {_quote(key)}"
    else:
        name = key
        subject = f"key {_quote(key)}"
    if not name:
        return f"{subject} is empty" if len(parts) == 1 else f"key {_quote(key)} has no name"
    if len(name) > _NAME_MAX:
        return f"{subject} is longer than {_NAME_MAX} characters ({len(name)})"
    if not _NAME.fullmatch(name):
        return f"{subject} must consist of {_NAME_RULE}"
    return None


def _value_problem(key: str, value: str) -> str | None:
    """Why ``value`` is not a label value, or None when it is (the empty value is one)."""
    if len(value) > _VALUE_MAX:
        return (
            f"value {_quote(value)} of key {_quote(key)} is longer than "
            f"{_VALUE_MAX} characters ({len(value)})"
        )
    if value and not _NAME.fullmatch(value):
        return (
            f"value {_quote(value)} of key {_quote(key)} must be empty or consist of {_NAME_RULE}"
        )
    return None


def _go_int(text: str) -> int | None:
    """``text`` as Go's ``strconv.ParseInt(text, 10, 64)`` reads it, or None when it fails."""
    if not _GO_INT.fullmatch(text):
        return None
    number = int(text)
    return number if _INT64_MIN <= number <= _INT64_MAX else None


_UNARY = frozenset({Operator.EXISTS, Operator.DOES_NOT_EXIST})
_SINGLE = frozenset(
    {Operator.EQUALS, Operator.NOT_EQUALS, Operator.GREATER_THAN, Operator.LESS_THAN}
)


def _requirement_problem(key: str, operator: Operator, values: tuple[str, ...]) -> str | None:
    """What ``labels.NewRequirement`` would refuse in this requirement, or None."""
    problem = _key_problem(key)
    if problem:
        return problem
    if operator in _UNARY and values:
        return f"{_describe_operator(operator)} takes no values"
    if operator in _SINGLE and len(values) != 1:
        return f"{_describe_operator(operator)} takes exactly one value"
    if operator in (Operator.IN, Operator.NOT_IN) and not values:
        return f"{_describe_operator(operator)} needs at least one value"
    if operator in (Operator.GREATER_THAN, Operator.LESS_THAN):
        for value in values:
            spelled = _quote(key + _SYMBOL[operator])
            if not value.isascii() or not value.isdigit():
                return f"{spelled} needs a whole number written in digits, not {_quote(value)}"
            if _go_int(value) is None:
                return f"{spelled} needs a number that fits in 64 bits, not {_quote(value)}"
    for value in values:
        problem = _value_problem(key, value)
        if problem:
            return problem
    return None


def _operator(spelling: str) -> Operator:
    """``spelling`` (an Operator, or its value such as "in", "!=" or "==") as an Operator."""
    try:
        return Operator(spelling)
    except ValueError:
        raise InvalidValueError(
            f"unknown selector operator {spelling!r}; use one of "
            + ", ".join(repr(op.value) for op in Operator)
        ) from None


def _describe_operator(operator: Operator) -> str:
    if operator is Operator.EXISTS:
        return "an existence requirement"
    return f"'{_SYMBOL[operator].strip() or operator.value}'"


_SYMBOL = {
    Operator.EQUALS: "=",
    Operator.NOT_EQUALS: "!=",
    Operator.IN: " in ",
    Operator.NOT_IN: " notin ",
    Operator.GREATER_THAN: ">",
    Operator.LESS_THAN: "<",
    Operator.EXISTS: "",
    Operator.DOES_NOT_EXIST: "",
}


# --- label selectors ------------------------------------------------------------------------


@dataclass(frozen=True)
class LabelRequirement:
    """One requirement of a label selector; ``values`` are kept sorted and unique."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        operator = _operator(self.operator)
        values = tuple(sorted(set(self.values)))
        object.__setattr__(self, "operator", operator)
        object.__setattr__(self, "values", values)
        problem = _requirement_problem(self.key, operator, values)
        if problem:
            raise InvalidValueError(f"invalid label requirement: {problem}")

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy this requirement (``Requirement.Matches``)."""
        op = self.operator
        present = self.key in labels
        if op is Operator.EXISTS:
            return present
        if op is Operator.DOES_NOT_EXIST:
            return not present
        if op in (Operator.NOT_EQUALS, Operator.NOT_IN):
            return not present or labels[self.key] not in self.values
        if not present:
            return False
        if op in (Operator.EQUALS, Operator.IN):
            return labels[self.key] in self.values
        have = _go_int(labels[self.key])
        want = _go_int(self.values[0])
        if have is None or want is None:
            return False
        return have > want if op is Operator.GREATER_THAN else have < want

    def __str__(self) -> str:
        op = self.operator
        if op is Operator.EXISTS:
            return self.key
        if op is Operator.DOES_NOT_EXIST:
            return f"!{self.key}"
        if op in (Operator.IN, Operator.NOT_IN):
            return f"{self.key}{_SYMBOL[op]}({','.join(self.values)})"
        return f"{self.key}{_SYMBOL[op]}{self.values[0]}"


def _label_order(requirement: LabelRequirement) -> tuple[str, str]:
    return (requirement.key, str(requirement))


@dataclass(frozen=True)
class LabelSelector:
    """Requirements that must all hold; with none it matches everything.

    Requirements are kept sorted by key (as Kubernetes sorts them), then by rendering, so
    two selectors that differ only in the order they were written compare equal.
    """

    requirements: tuple[LabelRequirement, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "requirements", tuple(sorted(self.requirements, key=_label_order)))

    @classmethod
    def parse(cls, text: str) -> LabelSelector:
        """Parse ``text`` as the API server parses ``labelSelector``.

        Raises InvalidValueError naming the selector and what is wrong with it.
        """
        try:
            requirements = _LabelParser(text).parse()
        except _SyntaxProblem as problem:
            raise InvalidValueError(f"invalid label selector {_quote(text)}: {problem}") from None
        return cls(tuple(requirements))

    @property
    def empty(self) -> bool:
        """True when the selector restricts nothing."""
        return not self.requirements

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether an object with these labels is selected."""
        return all(requirement.matches(labels) for requirement in self.requirements)

    def __str__(self) -> str:
        return ",".join(str(requirement) for requirement in self.requirements)


class _SyntaxProblem(Exception):
    """A parse failure inside one selector; the caller adds the selector to the message."""


class _Tok(enum.Enum):
    END = enum.auto()
    OPEN = enum.auto()
    CLOSE = enum.auto()
    COMMA = enum.auto()
    NOT = enum.auto()
    EQ = enum.auto()
    DOUBLE_EQ = enum.auto()
    NOT_EQ = enum.auto()
    GT = enum.auto()
    LT = enum.auto()
    IN = enum.auto()
    NOT_IN = enum.auto()
    IDENT = enum.auto()


_WHITESPACE = frozenset(" \t\r\n")
_SPECIAL = frozenset("=!(),<>")
_NUL = "\0"
_SYMBOL_TOKENS = {
    "(": _Tok.OPEN,
    ")": _Tok.CLOSE,
    ",": _Tok.COMMA,
    "!": _Tok.NOT,
    "=": _Tok.EQ,
    "==": _Tok.DOUBLE_EQ,
    "!=": _Tok.NOT_EQ,
    ">": _Tok.GT,
    "<": _Tok.LT,
}
_WORD_TOKENS = {"in": _Tok.IN, "notin": _Tok.NOT_IN}
_BINARY = {
    _Tok.EQ: Operator.EQUALS,
    _Tok.DOUBLE_EQ: Operator.EQUALS,
    _Tok.NOT_EQ: Operator.NOT_EQUALS,
    _Tok.IN: Operator.IN,
    _Tok.NOT_IN: Operator.NOT_IN,
    _Tok.GT: Operator.GREATER_THAN,
    _Tok.LT: Operator.LESS_THAN,
}
_OPERATOR_LIST = "=, ==, !=, in, notin, > or <"


def _lex(text: str) -> list[tuple[_Tok, str]]:
    """Tokens of ``text``, ending with END, exactly as ``labels.Lexer`` produces them.

    Go reads bytes and treats byte 0 as the end of input wherever it reads one; reading a
    NUL character here does the same, so quirks such as "a=b \\0junk" meaning "a=b" agree.
    """
    tokens: list[tuple[_Tok, str]] = []
    pos = 0
    size = len(text)

    def read() -> str:
        nonlocal pos
        if pos < size:
            pos += 1
            return text[pos - 1]
        return _NUL

    while True:
        ch = read()
        while ch in _WHITESPACE:
            ch = read()
        if ch == _NUL:
            tokens.append((_Tok.END, ""))
            return tokens
        if ch in _SPECIAL:
            # Longest run of symbols that is a token: "!=" over "!", "==" over "=".
            buffer = ch
            last = (_SYMBOL_TOKENS[ch], ch)
            while True:
                ch = read()
                if ch == _NUL:
                    break
                if ch not in _SPECIAL:
                    pos -= 1
                    break
                buffer += ch
                token = _SYMBOL_TOKENS.get(buffer)
                if token is None:
                    pos -= 1
                    break
                last = (token, buffer)
            tokens.append(last)
        else:
            chars = [ch]
            while True:
                ch = read()
                if ch == _NUL:
                    break
                if ch in _SPECIAL or ch in _WHITESPACE:
                    pos -= 1
                    break
                chars.append(ch)
            word = "".join(chars)
            tokens.append((_WORD_TOKENS.get(word, _Tok.IDENT), word))


def _shown(token: tuple[_Tok, str]) -> str:
    kind, literal = token
    return "the end of the selector" if kind is _Tok.END else _quote(literal)


class _LabelParser:
    """The recursive-descent parser of ``labels.Parser``, with messages for people.

    Where a value may stand (the ``Values`` context) ``in`` and ``notin`` are plain words;
    only right after a key are they operators.
    """

    def __init__(self, text: str) -> None:
        self._tokens = _lex(text)
        self._pos = 0

    def _peek(self, values: bool = True) -> tuple[_Tok, str]:
        kind, literal = self._tokens[min(self._pos, len(self._tokens) - 1)]
        if values and kind in (_Tok.IN, _Tok.NOT_IN):
            kind = _Tok.IDENT
        return kind, literal

    def _take(self, values: bool = True) -> tuple[_Tok, str]:
        token = self._peek(values)
        self._pos += 1
        return token

    def parse(self) -> list[LabelRequirement]:
        requirements: list[LabelRequirement] = []
        token = self._peek()
        if token[0] is _Tok.END:
            return requirements
        if token[0] not in (_Tok.IDENT, _Tok.NOT):
            raise _SyntaxProblem(
                f"expected a requirement such as key, !key, key=value or key in (a,b), "
                f"found {_shown(token)}"
            )
        while True:
            requirements.append(self._requirement())
            token = self._take()
            if token[0] is _Tok.END:
                return requirements
            if token[0] is not _Tok.COMMA:
                raise _SyntaxProblem(
                    f"expected ',' or the end of the selector after "
                    f"{_quote(str(requirements[-1]))}, found {_shown(token)}"
                )
            token = self._peek()
            if token[0] not in (_Tok.IDENT, _Tok.NOT):
                raise _SyntaxProblem(f"expected a requirement after ',', found {_shown(token)}")

    def _requirement(self) -> LabelRequirement:
        negated = False
        token = self._take()
        if token[0] is _Tok.NOT:
            negated = True
            token = self._take()
            if token[0] is not _Tok.IDENT:
                raise _SyntaxProblem(f"expected a key after '!', found {_shown(token)}")
        key = token[1]
        problem = _key_problem(key)
        if problem:
            raise _SyntaxProblem(problem)
        if negated:
            # "!key" is complete; anything but ',' or the end after it is refused by parse().
            return self._build(key, Operator.DOES_NOT_EXIST, ())
        if self._peek()[0] in (_Tok.END, _Tok.COMMA):
            return self._build(key, Operator.EXISTS, ())
        token = self._take(values=False)
        operator = _BINARY.get(token[0])
        if operator is None:
            raise _SyntaxProblem(
                f"expected an operator ({_OPERATOR_LIST}), ',' or the end of the selector "
                f"after key {_quote(key)}, found {_shown(token)}"
            )
        spelled = f"{key} {token[1]}" if token[0] in (_Tok.IN, _Tok.NOT_IN) else key + token[1]
        if operator in (Operator.IN, Operator.NOT_IN):
            values = self._value_list(spelled)
        else:
            values = self._single_value(spelled)
        return self._build(key, operator, values)

    @staticmethod
    def _build(key: str, operator: Operator, values: tuple[str, ...]) -> LabelRequirement:
        values = tuple(sorted(set(values)))
        problem = _requirement_problem(key, operator, values)
        if problem:
            raise _SyntaxProblem(problem)
        return LabelRequirement(key, operator, values)

    def _single_value(self, spelled: str) -> tuple[str, ...]:
        token = self._peek()
        if token[0] in (_Tok.END, _Tok.COMMA):
            return ("",)
        self._take()
        if token[0] is not _Tok.IDENT:
            raise _SyntaxProblem(f"expected a value after {_quote(spelled)}, found {_shown(token)}")
        return (token[1],)

    def _value_list(self, spelled: str) -> tuple[str, ...]:
        token = self._take()
        if token[0] is not _Tok.OPEN:
            raise _SyntaxProblem(
                f"expected a parenthesised list such as (a,b) after {_quote(spelled)}, "
                f"found {_shown(token)}"
            )
        token = self._peek()
        if token[0] is _Tok.CLOSE:
            self._take()
            return ("",)
        if token[0] not in (_Tok.IDENT, _Tok.COMMA):
            raise _SyntaxProblem(
                f"expected a value, ',' or ')' after {_quote(spelled + ' (')}, "
                f"found {_shown(token)}"
            )
        values = self._identifiers(spelled)
        self._take()  # the ')' that _identifiers stopped in front of
        return values

    def _identifiers(self, spelled: str) -> tuple[str, ...]:
        """``parseIdentifiersList``: values and empty values up to, not including, ')'."""
        values: list[str] = []
        while True:
            token = self._take()
            if token[0] is _Tok.IDENT:
                values.append(token[1])
                after = self._peek()
                if after[0] is _Tok.CLOSE:
                    return tuple(values)
                if after[0] is not _Tok.COMMA:
                    raise _SyntaxProblem(
                        f"expected ',' or ')' after {_quote(token[1])} in the list of "
                        f"{_quote(spelled)}, found {_shown(after)}"
                    )
            elif token[0] is _Tok.COMMA:
                if not values:
                    values.append("")  # "(,"
                after = self._peek()
                if after[0] is _Tok.CLOSE:
                    values.append("")  # ",)"
                    return tuple(values)
                if after[0] is _Tok.COMMA:
                    self._take()
                    values.append("")  # ",,"
            else:
                raise _SyntaxProblem(
                    f"expected a value or ',' in the list of {_quote(spelled)}, "
                    f"found {_shown(token)}"
                )


# --- field selectors ------------------------------------------------------------------------


def _escape(value: str) -> str:
    """``fields.EscapeValue``: protect ``\\``, ``,`` and ``=`` with a backslash."""
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


def _unescape(value: str) -> str:
    """``fields.UnescapeValue``: undo ``_escape``, refusing bare ``,``/``=`` and other escapes."""
    out: list[str] = []
    escaping = False
    for ch in value:
        if escaping:
            if ch not in "\\,=":
                sequence = "\\" + ch
                raise _SyntaxProblem(
                    f"invalid escape sequence {_quote(sequence)} in value {_quote(value)}; "
                    "only \\\\, \\, and \\= may be escaped"
                )
            out.append(ch)
            escaping = False
        elif ch == "\\":
            escaping = True
        elif ch in ",=":
            raise _SyntaxProblem(f"'{ch}' in value {_quote(value)} must be escaped as \\{ch}")
        else:
            out.append(ch)
    if escaping:
        raise _SyntaxProblem(f"value {_quote(value)} ends in an unfinished escape '\\'")
    return "".join(out)


def _split_terms(text: str) -> list[str]:
    """``fields.splitTerms``: split at commas that are not escaped."""
    terms: list[str] = []
    start = 0
    escaped = False
    for index, ch in enumerate(text):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ",":
            terms.append(text[start:index])
            start = index + 1
    terms.append(text[start:])
    return terms


_FIELD_OPERATORS = (("!=", Operator.NOT_EQUALS), ("==", Operator.EQUALS), ("=", Operator.EQUALS))


def _split_term(term: str) -> tuple[str, Operator, str] | None:
    """``fields.splitTerm``: the first operator from the left, ``!=`` and ``==`` before ``=``."""
    for index in range(len(term)):
        for spelling, operator in _FIELD_OPERATORS:
            if term.startswith(spelling, index):
                return term[:index], operator, term[index + len(spelling) :]
    return None


@dataclass(frozen=True)
class FieldRequirement:
    """``field=value`` or ``field!=value``; a field the object lacks reads as ``""``."""

    field: str
    operator: Operator
    value: str

    def __post_init__(self) -> None:
        operator = _operator(self.operator)
        if operator not in (Operator.EQUALS, Operator.NOT_EQUALS):
            raise InvalidValueError(
                f"invalid field requirement on {_quote(self.field)}: field selectors "
                f"support only = and !=, not {operator.value}"
            )
        object.__setattr__(self, "operator", operator)

    def matches(self, fields: Mapping[str, str]) -> bool:
        """Whether an object with these field values satisfies this requirement."""
        equal = fields.get(self.field, "") == self.value
        return equal if self.operator is Operator.EQUALS else not equal

    def __str__(self) -> str:
        return f"{self.field}{self.operator.value}{_escape(self.value)}"


@dataclass(frozen=True)
class FieldSelector:
    """Field requirements that must all hold; with none it matches everything."""

    requirements: tuple[FieldRequirement, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "requirements", tuple(sorted(self.requirements, key=str)))

    @classmethod
    def parse(
        cls,
        text: str,
        allowed: AbstractSet[str] = SANDBOX_FIELDS,
        resource: str = "sandboxes",
    ) -> FieldSelector:
        """Parse ``text`` as the API server parses ``fieldSelector``, then check its fields.

        Raises InvalidValueError for text that does not parse and UnsupportedFieldError
        (naming the first such field, in sorted order) for a field outside ``allowed``.
        """
        requirements: list[FieldRequirement] = []
        for term in sorted(_split_terms(text)):
            if not term:
                continue  # "a=b,,c=d" and a trailing comma are accepted
            split = _split_term(term)
            if split is None:
                raise InvalidValueError(
                    f"invalid field selector {_quote(text)}: {_quote(term)} has no operator; "
                    "write field=value, field==value or field!=value"
                )
            field, operator, raw = split
            try:
                value = _unescape(raw)
            except _SyntaxProblem as problem:
                raise InvalidValueError(
                    f"invalid field selector {_quote(text)}: {problem}"
                ) from None
            requirements.append(FieldRequirement(field, operator, value))
        for requirement in requirements:
            if requirement.field not in allowed:
                raise UnsupportedFieldError(requirement.field, resource, allowed)
        return cls(tuple(requirements))

    @property
    def empty(self) -> bool:
        """True when the selector restricts nothing."""
        return not self.requirements

    def matches(self, fields: Mapping[str, str]) -> bool:
        """Whether an object with these field values is selected."""
        return all(requirement.matches(fields) for requirement in self.requirements)

    def exact(self, field: str) -> str | None:
        """The value ``field`` is pinned to, or None.

        A field is pinned when every requirement on it is the same ``=``/``==`` requirement,
        e.g. ``metadata.name=web`` (also with other fields alongside). A ``!=`` on the field,
        or two different requirements on it, leave it unpinned.
        """
        on_field = {r for r in self.requirements if r.field == field}
        if len(on_field) != 1:
            return None
        (only,) = on_field
        return only.value if only.operator is Operator.EQUALS else None

    def __str__(self) -> str:
        return ",".join(str(requirement) for requirement in self.requirements)

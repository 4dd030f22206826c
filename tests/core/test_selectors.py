"""Kubernetes label and field selectors, parsed and matched as the API server does."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandboxctl.core.errors import InvalidValueError, SandboxctlError
from sandboxctl.core.selectors import (
    SANDBOX_FIELDS,
    FieldRequirement,
    FieldSelector,
    LabelRequirement,
    LabelSelector,
    Operator,
    UnsupportedFieldError,
)
from tests.core.fleet_factory import quick

fast = settings(quick, max_examples=50)

PHASE = "sandbox.cocoonstack.io/phase"
INT64_MAX = "9223372036854775807"
INT64_MIN = "-9223372036854775808"

Labels = dict[str, str]

# --- label selectors: what matches ----------------------------------------------------------

# (selector, label sets it selects, label sets it does not select)
LABEL_CASES: list[tuple[str, list[Labels], list[Labels]]] = [
    # the empty selector matches everything
    ("", [{}, {"a": "b"}], []),
    ("  \t\r\n ", [{}, {"a": "b"}], []),
    # exists / does not exist
    ("a", [{"a": ""}, {"a": "x"}], [{}, {"b": "x"}, {"A": "x"}]),
    ("!a", [{}, {"b": "x"}, {"A": ""}], [{"a": ""}, {"a": "x"}]),
    ("! a", [{}], [{"a": "x"}]),
    # equality
    ("a=b", [{"a": "b"}, {"a": "b", "c": "d"}], [{}, {"a": "c"}, {"a": ""}, {"A": "b"}]),
    ("a==b", [{"a": "b"}], [{}, {"a": "c"}, {"a": "B"}]),
    ("a=in", [{"a": "in"}], [{"a": "notin"}]),
    ("a=notin", [{"a": "notin"}], [{"a": "in"}]),
    # != matches objects that lack the key
    ("a!=b", [{}, {"a": "c"}, {"a": ""}, {"b": "b"}], [{"a": "b"}]),
    # empty values
    ("a=", [{"a": ""}], [{}, {"a": "x"}]),
    ("a==", [{"a": ""}], [{}, {"a": "x"}]),
    ("a!=", [{}, {"a": "x"}], [{"a": ""}]),
    ("a=,b", [{"a": "", "b": "x"}], [{"b": "x"}, {"a": ""}, {"a": "x", "b": "x"}]),
    # set-based
    ("a in (b,c)", [{"a": "b"}, {"a": "c"}], [{}, {"a": "d"}, {"a": ""}]),
    ("a in (b)", [{"a": "b"}], [{"a": "c"}, {}]),
    ("a notin (b,c)", [{}, {"a": "d"}, {"a": ""}], [{"a": "b"}, {"a": "c"}]),
    ("a in ()", [{"a": ""}], [{}, {"a": "x"}]),
    ("a notin ()", [{}, {"a": "x"}], [{"a": ""}]),
    ("a in (,)", [{"a": ""}], [{}, {"a": "b"}]),
    ("a in (,b)", [{"a": ""}, {"a": "b"}], [{}, {"a": "c"}]),
    ("a in (b,)", [{"a": ""}, {"a": "b"}], [{}, {"a": "c"}]),
    ("a in (b,,c)", [{"a": ""}, {"a": "b"}, {"a": "c"}], [{}, {"a": "d"}]),
    ("a in (b,b,b)", [{"a": "b"}], [{"a": ""}]),
    ("a notin (,b)", [{}, {"a": "c"}], [{"a": ""}, {"a": "b"}]),
    # "in" and "notin" are keywords only where an operator may stand
    ("in in (in, notin)", [{"in": "in"}, {"in": "notin"}], [{}, {"in": "x"}]),
    ("notin notin (in)", [{}, {"notin": "x"}], [{"notin": "in"}]),
    ("in", [{"in": ""}], [{}]),
    ("!notin", [{}], [{"notin": "x"}]),
    ("in=notin", [{"in": "notin"}], [{"in": "in"}]),
    # prefixed keys
    (f"{PHASE}=running", [{PHASE: "running"}], [{"phase": "running"}, {PHASE: "Running"}, {}]),
    (f"{PHASE} in (running, paused)", [{PHASE: "paused"}], [{PHASE: "stopped"}, {}]),
    (f"{PHASE} notin (running)", [{}, {PHASE: "paused"}], [{PHASE: "running"}]),
    (f"!{PHASE}", [{}, {"phase": "running"}], [{PHASE: ""}]),
    (f"{PHASE}", [{PHASE: ""}], [{"phase": ""}]),
    ("a.b-c.example/X_y.z-9=V_1.w-2", [{"a.b-c.example/X_y.z-9": "V_1.w-2"}], [{}]),
    ("0/0=0", [{"0/0": "0"}], [{"0": "0"}]),
    # several requirements are ANDed
    (
        "app=web,tier!=db,!legacy",
        [{"app": "web"}, {"app": "web", "tier": "cache"}],
        [{"app": "web", "tier": "db"}, {"app": "web", "legacy": ""}, {"tier": "cache"}],
    ),
    ("a,b", [{"a": "", "b": ""}], [{"a": ""}, {"b": ""}, {}]),
    ("a=b,a=c", [], [{"a": "b"}, {"a": "c"}, {}]),
    ("a,!a", [], [{}, {"a": ""}]),
    ("a=b,a in (b,c),a notin (c),a!=d,a", [{"a": "b"}], [{"a": "c"}, {}]),
    # integer comparisons: the label must be present and parse as a 64-bit integer
    (
        "a>5",
        [{"a": "6"}, {"a": "0010"}, {"a": "+6"}, {"a": INT64_MAX}],
        [
            {},
            {"a": "5"},
            {"a": "-7"},
            {"a": "x"},
            {"a": ""},
            {"a": "6.0"},
            {"a": " 6"},
            {"a": "6_0"},
            {"a": "9223372036854775808"},
            {"a": "٦"},
        ],
    ),
    ("a<5", [{"a": "4"}, {"a": "-7"}, {"a": INT64_MIN}, {"a": "-0"}], [{}, {"a": "5"}, {"a": "x"}]),
    ("a<0", [{"a": "-1"}], [{"a": "0"}, {"a": "+0"}, {"a": "-9223372036854775809"}]),
    ("a>007", [{"a": "8"}], [{"a": "7"}]),
    (f"a<{INT64_MAX}", [{"a": "0"}], [{"a": INT64_MAX}]),
    ("a>0,a<10", [{"a": "1"}, {"a": "9"}], [{"a": "0"}, {"a": "10"}, {}]),
    # whitespace: space, tab, CR and LF between any two tokens
    ("  a  =  b  ", [{"a": "b"}], [{"a": " b"}]),
    ("a != b", [{"a": "c"}], [{"a": "b"}]),
    ("\ta\tin\t(\tb\t,\tc\t)\t", [{"a": "c"}], [{"a": "d"}]),
    ("a\nin\r\n(b)", [{"a": "b"}], [{"a": "c"}]),
    ("a in(b)", [{"a": "b"}], [{"a": "c"}]),
    ("a notin(b)", [{"a": "c"}], [{"a": "b"}]),
    ("a , b", [{"a": "", "b": ""}], [{"a": ""}]),
    ("a>\t5", [{"a": "6"}], [{"a": "5"}]),
    # longest legal key, prefix and value
    ("k" * 63 + "=" + "v" * 63, [{"k" * 63: "v" * 63}], [{"k" * 63: "v" * 62}]),
    ("p" * 253 + "/n", [{"p" * 253 + "/n": ""}], [{}]),
    # like Go's lexer, a NUL character read between tokens ends the selector
    ("a=b \0junk", [{"a": "b"}], [{"a": "c"}]),
    ("a=\0b", [{"a": "b"}], [{"a": ""}]),
]


@pytest.mark.parametrize(
    ("text", "selected", "not_selected"),
    LABEL_CASES,
    ids=[repr(case[0]) for case in LABEL_CASES],
)
def test_label_selector_matches_as_kubernetes_does(
    text: str, selected: list[Labels], not_selected: list[Labels]
):
    selector = LabelSelector.parse(text)
    for labels in selected:
        assert selector.matches(labels), f"{text!r} should select {labels}"
    for labels in not_selected:
        assert not selector.matches(labels), f"{text!r} should not select {labels}"


@pytest.mark.parametrize("text", [case[0] for case in LABEL_CASES], ids=repr)
def test_rendering_parses_back_to_an_equal_selector(text: str):
    selector = LabelSelector.parse(text)
    rendered = str(selector)
    again = LabelSelector.parse(rendered)
    assert again == selector
    assert str(again) == rendered


def test_matches_takes_any_mapping():
    class Frozen(Mapping[str, str]):
        def __init__(self, data: Labels) -> None:
            self._data = data

        def __getitem__(self, key: str) -> str:
            return self._data[key]

        def __iter__(self) -> Iterator[str]:
            return iter(self._data)

        def __len__(self) -> int:
            return len(self._data)

    assert LabelSelector.parse("a=b,c notin (d)").matches(Frozen({"a": "b"}))
    assert not LabelSelector.parse("a=b,c notin (d)").matches(Frozen({"a": "b", "c": "d"}))


# --- label selectors: canonical rendering ---------------------------------------------------


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("", ""),
        ("a", "a"),
        ("b,a", "a,b"),
        ("a==b", "a=b"),
        ("a = b", "a=b"),
        ("a=", "a="),
        ("a != b", "a!=b"),
        ("  a  in  ( c , b , c )", "a in (b,c)"),
        ("a notin(b)", "a notin (b)"),
        ("a in (b,,c)", "a in (,b,c)"),
        ("a in (b,)", "a in (,b)"),
        ("a in (,)", "a in ()"),
        ("a in ()", "a in ()"),
        ("! a", "!a"),
        ("a > 5", "a>5"),
        ("a<007", "a<007"),
        (
            "z,!y,x=1,w!=2,v notin (3),u>4,t<5,s in (6)",
            "s in (6),t<5,u>4,v notin (3),w!=2,x=1,!y,z",
        ),
        ("a!=x,!a,a", "!a,a,a!=x"),
        ("a,a", "a,a"),
        (f"{PHASE}=running,app=web", f"app=web,{PHASE}=running"),
        ("in in (notin,in)", "in in (in,notin)"),
    ],
)
def test_str_is_canonical(text: str, canonical: str):
    assert str(LabelSelector.parse(text)) == canonical


def test_order_of_requirements_does_not_affect_equality():
    assert LabelSelector.parse("a=1,b in (y,x),!c") == LabelSelector.parse("!c , b in (x,y), a==1")
    assert hash(LabelSelector.parse("a,b")) == hash(LabelSelector.parse("b,a"))


def test_empty_property():
    assert LabelSelector.parse("").empty
    assert LabelSelector.parse(" ").empty
    assert LabelSelector().empty
    assert not LabelSelector.parse("a").empty
    assert not LabelSelector.parse("a notin ()").empty


def test_parse_exposes_requirements():
    selector = LabelSelector.parse(f"{PHASE} in (running,paused),!b,c>3")
    assert selector.requirements == (
        LabelRequirement("b", Operator.DOES_NOT_EXIST),
        LabelRequirement("c", Operator.GREATER_THAN, ("3",)),
        LabelRequirement(PHASE, Operator.IN, ("paused", "running")),
    )


def test_selectors_are_frozen():
    selector = LabelSelector.parse("a=b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        selector.requirements = ()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        selector.requirements[0].key = "c"  # type: ignore[misc]


# --- label selectors: what does not parse ---------------------------------------------------

# (selector, a fragment of the message that names the problem)
INVALID_LABEL_CASES: list[tuple[str, str]] = [
    ("a in b", 'expected a parenthesised list such as (a,b) after "a in", found "b"'),
    ("a notin b", 'after "a notin", found "b"'),
    ("a in b,c", 'after "a in", found "b"'),
    ("a notin", 'after "a notin", found the end of the selector'),
    ("a in (b", "expected ',' or ')' after \"b\""),
    ("a in (b,c", "found the end of the selector"),
    ("a in (", "found the end of the selector"),
    ("a in ((b))", 'found "("'),
    ("a in (b c)", 'found "c"'),
    ("a in (b)(c)", 'found "("'),
    ("a in (b=c)", 'found "="'),
    ("a in ()x", 'found "x"'),
    ("a in (a,,)", "expected a value or ',' in the list"),  # Kubernetes refuses ",,)"
    ("a in (,,)", "expected a value or ','"),
    ("=b", 'expected a requirement such as key, !key, key=value or key in (a,b), found "="'),
    ("==b", 'found "=="'),
    ("(a)", 'found "("'),
    (",a", 'found ","'),
    ("a,", "expected a requirement after ',', found the end of the selector"),
    ("a,,b", "expected a requirement after ',', found \",\""),
    ("a=b,", "found the end of the selector"),
    ("a b", 'after key "a", found "b"'),
    ("a b=c", 'after key "a", found "b"'),
    ("in (x)", 'after key "in", found "("'),
    ("notin (x)", 'after key "notin", found "("'),
    ("a!b", 'after key "a", found "!"'),
    ("a (b)", 'found "("'),
    ("!", "expected a key after '!', found the end of the selector"),
    ("!!a", "expected a key after '!', found \"!\""),
    ("!=a", 'found "!="'),
    ("!a=b", 'expected \',\' or the end of the selector after "!a", found "="'),
    ("!a in (b)", 'found "in"'),
    ("a=b c", 'after "a=b", found "c"'),
    ("a=b)", 'found ")"'),
    ("a=b=c", 'found "="'),
    ("a===b", 'expected a value after "a==", found "="'),
    ("a=!b", 'expected a value after "a=", found "!"'),
    ("a!==b", 'expected a value after "a!=", found "="'),
    ("a=(b)", 'expected a value after "a=", found "("'),
    ("a>=5", 'expected a value after "a>", found "="'),
    ("a>", '"a>" needs a whole number written in digits, not ""'),
    ("a<", '"a<" needs a whole number'),
    ("a>b", 'not "b"'),
    ("a>1.5", 'not "1.5"'),
    ("a<-1", 'not "-1"'),
    ("a>+1", 'not "+1"'),
    ("a>9223372036854775808", '"a>" needs a number that fits in 64 bits'),
    ("a>" + "0" * 64, "longer than 63 characters"),
    # keys
    ("x" * 64, f'key "{"x" * 64}" is longer than 63 characters (64)'),
    ("p/" + "x" * 64, f'the name "{"x" * 64}" of key "p/{"x" * 64}" is longer than 63'),
    ("p" * 254 + "/n", "is longer than 253 characters"),
    ("-a", 'key "-a" must consist of letters, digits'),
    ("a-", "starting and ending with a letter or digit"),
    ("_a=b", 'key "_a"'),
    ("a.=b", 'key "a."'),
    ("a*", 'key "a*"'),
    ("a$=b", 'key "a$"'),
    ("é=a", 'key "é"'),
    ("a/b/c", "has more than one '/'"),
    ("/a", 'key "/a" has an empty prefix'),
    ("a/", 'key "a/" has no name'),
    ("a/-b", 'the name "-b" of key "a/-b"'),
    ("Example.com/a", 'the prefix "Example.com" of key "Example.com/a" is not a DNS subdomain'),
    ("-a.com/b", "is not a DNS subdomain"),
    ("a..com/b", "is not a DNS subdomain"),
    ("a_b.com/c", "is not a DNS subdomain"),
    ("a.com-/c", "is not a DNS subdomain"),
    ("!a b", 'found "b"'),
    ("!-a", 'key "-a"'),
    # values
    ("a=" + "v" * 64, f'value "{"v" * 64}" of key "a" is longer than 63 characters (64)'),
    ("a=-b", 'value "-b" of key "a" must be empty or consist of letters'),
    ("a=b-", 'value "b-"'),
    ("a=/b", 'value "/b"'),
    ("a=é", 'value "é"'),
    ("a in (b,-c)", 'value "-c"'),
    ("a notin (ok,.bad)", 'value ".bad"'),
    # a NUL inside a token splits it, as in Go
    ("a=b\0junk", 'after "a=b", found "junk"'),
    ("a\0b", 'after key "a", found "b"'),
]


@pytest.mark.parametrize(
    ("text", "fragment"),
    INVALID_LABEL_CASES,
    ids=[repr(case[0])[:40] for case in INVALID_LABEL_CASES],
)
def test_invalid_label_selectors_are_refused(text: str, fragment: str):
    with pytest.raises(InvalidValueError) as caught:
        LabelSelector.parse(text)
    message = str(caught.value)
    assert message.startswith('invalid label selector "')
    assert fragment in message


def test_error_message_names_the_selector_and_the_problem():
    with pytest.raises(InvalidValueError) as caught:
        LabelSelector.parse("a in b")
    assert str(caught.value) == (
        'invalid label selector "a in b": '
        'expected a parenthesised list such as (a,b) after "a in", found "b"'
    )


def test_error_message_stays_on_one_line():
    with pytest.raises(InvalidValueError) as caught:
        LabelSelector.parse("a\nb")
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith('invalid label selector "a\\nb": ')


def test_parse_errors_are_sandboxctl_value_errors():
    with pytest.raises(InvalidValueError) as caught:
        LabelSelector.parse("=")
    assert isinstance(caught.value, SandboxctlError)
    assert isinstance(caught.value, ValueError)
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__


# --- label requirements built directly ------------------------------------------------------


def test_requirement_values_are_sorted_and_unique():
    requirement = LabelRequirement("a", Operator.IN, ("c", "b", "c"))
    assert requirement.values == ("b", "c")
    assert str(requirement) == "a in (b,c)"


def test_requirement_accepts_operator_spellings():
    assert LabelRequirement("a", "==", ("b",)).operator is Operator.EQUALS  # type: ignore[arg-type]
    assert LabelRequirement("a", "notin", ("b",)).operator is Operator.NOT_IN  # type: ignore[arg-type]
    assert Operator("==") is Operator.EQUALS


@pytest.mark.parametrize(
    ("key", "operator", "values", "fragment"),
    [
        ("a b", Operator.EXISTS, (), 'key "a b"'),
        ("", Operator.EXISTS, (), 'key "" is empty'),
        ("a", Operator.EXISTS, ("x",), "takes no values"),
        ("a", Operator.DOES_NOT_EXIST, ("x",), "'!' takes no values"),
        ("a", Operator.EQUALS, ("x", "y"), "'=' takes exactly one value"),
        ("a", Operator.NOT_EQUALS, (), "'!=' takes exactly one value"),
        ("a", Operator.IN, (), "'in' needs at least one value"),
        ("a", Operator.NOT_IN, (), "'notin' needs at least one value"),
        ("a", Operator.GREATER_THAN, ("x",), "needs a whole number"),
        ("a", Operator.LESS_THAN, ("1", "2"), "takes exactly one value"),
        ("a", Operator.IN, ("ok", "not ok"), 'value "not ok"'),
        ("a", "~", (), "unknown selector operator '~'"),
    ],
)
def test_invalid_requirements_are_refused(
    key: str, operator: Operator, values: tuple[str, ...], fragment: str
):
    with pytest.raises(InvalidValueError) as caught:
        LabelRequirement(key, operator, values)
    assert fragment in str(caught.value)


def test_selector_built_from_requirements_equals_the_parsed_one():
    built = LabelSelector(
        (
            LabelRequirement("z", Operator.EXISTS),
            LabelRequirement("a", Operator.NOT_IN, ("y", "x")),
        )
    )
    assert built == LabelSelector.parse("a notin (x,y),z")
    assert str(built) == "a notin (x,y),z"


# --- field selectors ------------------------------------------------------------------------

# (selector, field sets it selects, field sets it does not select)
FIELD_CASES: list[tuple[str, list[Labels], list[Labels]]] = [
    ("", [{}, {"metadata.name": "web"}], []),
    (",", [{}], []),
    ("metadata.name=web", [{"metadata.name": "web"}], [{"metadata.name": "db"}, {}]),
    ("metadata.name==web", [{"metadata.name": "web"}], [{"metadata.name": "db"}]),
    ("metadata.name!=web", [{}, {"metadata.name": "db"}], [{"metadata.name": "web"}]),
    # a field the object lacks reads as the empty string
    ("metadata.name=", [{}, {"metadata.name": ""}], [{"metadata.name": "x"}]),
    ("metadata.name!=", [{"metadata.name": "x"}], [{}, {"metadata.name": ""}]),
    (
        "metadata.name=web,metadata.namespace=default",
        [{"metadata.name": "web", "metadata.namespace": "default"}],
        [{"metadata.name": "web"}, {"metadata.namespace": "default"}],
    ),
    (
        "metadata.name=web,,status.nodeName!=n1,",
        [{"metadata.name": "web", "status.nodeName": "n2"}, {"metadata.name": "web"}],
        [{"metadata.name": "web", "status.nodeName": "n1"}],
    ),
    # escaping
    ("metadata.name=a\\,b", [{"metadata.name": "a,b"}], [{"metadata.name": "a\\,b"}]),
    ("metadata.name=a\\=b", [{"metadata.name": "a=b"}], [{"metadata.name": "a\\=b"}]),
    ("metadata.name=a\\\\b", [{"metadata.name": "a\\b"}], [{"metadata.name": "a\\\\b"}]),
    (
        "metadata.name=a\\\\,status.nodeName=n",
        [{"metadata.name": "a\\", "status.nodeName": "n"}],
        [{"metadata.name": "a\\,status.nodeName=n"}],
    ),
    ("metadata.name!=\\,\\=\\\\", [{"metadata.name": "x"}], [{"metadata.name": ",=\\"}]),
    # nothing is trimmed, anything but , = and \ is taken literally
    ("metadata.name= a b ", [{"metadata.name": " a b "}], [{"metadata.name": "a b"}]),
    ("metadata.name=!x", [{"metadata.name": "!x"}], [{"metadata.name": "x"}]),
    ("metadata.name=(ünï)", [{"metadata.name": "(ünï)"}], [{}]),
    ("metadata.name=a,metadata.name=b", [], [{"metadata.name": "a"}, {"metadata.name": "b"}]),
]


@pytest.mark.parametrize(
    ("text", "selected", "not_selected"),
    FIELD_CASES,
    ids=[repr(case[0]) for case in FIELD_CASES],
)
def test_field_selector_matches_as_kubernetes_does(
    text: str, selected: list[Labels], not_selected: list[Labels]
):
    selector = FieldSelector.parse(text)
    for fields in selected:
        assert selector.matches(fields), f"{text!r} should select {fields}"
    for fields in not_selected:
        assert not selector.matches(fields), f"{text!r} should not select {fields}"
    again = FieldSelector.parse(str(selector))
    assert again == selector
    assert str(again) == str(selector)


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("", ""),
        ("metadata.name==web", "metadata.name=web"),
        ("status.nodeName=n1,metadata.name=web", "metadata.name=web,status.nodeName=n1"),
        ("metadata.name=a\\,b", "metadata.name=a\\,b"),
        ("metadata.name=a\\=b\\\\", "metadata.name=a\\=b\\\\"),
        (",metadata.name!=x,,", "metadata.name!=x"),
    ],
)
def test_field_selector_str_is_canonical(text: str, canonical: str):
    assert str(FieldSelector.parse(text)) == canonical


def test_field_selector_exposes_unescaped_requirements():
    selector = FieldSelector.parse("metadata.name=a\\,b,status.nodeName!=n1")
    assert selector.requirements == (
        FieldRequirement("metadata.name", Operator.EQUALS, "a,b"),
        FieldRequirement("status.nodeName", Operator.NOT_EQUALS, "n1"),
    )


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("metadata.name", '"metadata.name" has no operator; write field=value'),
        ("metadata.name=a,b", '"b" has no operator'),
        ("metadata.name=a,,b", '"b" has no operator'),
        ("metadata.name=a=b", "'=' in value \"a=b\" must be escaped as \\="),
        ("metadata.name===a", "'=' in value \"=a\" must be escaped"),
        ("metadata.name!=a=b", "'=' in value \"a=b\""),
        ("metadata.name!=a!=b", "'=' in value \"a!=b\""),
        ("metadata.name=a\\x", 'invalid escape sequence "\\x" in value "a\\x"'),
        ("metadata.name=a\\ b", 'invalid escape sequence "\\ "'),
        ("metadata.name=a\\", "value \"a\\\" ends in an unfinished escape '\\'"),
        ("metadata.name=a\\\\\\", "ends in an unfinished escape"),
    ],
)
def test_invalid_field_selectors_are_refused(text: str, fragment: str):
    with pytest.raises(InvalidValueError) as caught:
        FieldSelector.parse(text)
    assert not isinstance(caught.value, UnsupportedFieldError)
    message = str(caught.value)
    assert message.startswith(f'invalid field selector "{text}": ')
    assert fragment in message


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("spec.foo=1", "spec.foo"),
        ("metadata.labels=x", "metadata.labels"),
        ("Metadata.name=x", "Metadata.name"),
        (" metadata.name=x", " metadata.name"),  # nothing is trimmed
        ("metadata.name =x", "metadata.name "),
        ("=x", ""),
        ("metadata.name=web,spec.foo!=1", "spec.foo"),
        ("z.f=1,a.f=2", "a.f"),  # the first in sorted order, as Kubernetes checks them
    ],
)
def test_unsupported_fields_are_named(text: str, field: str):
    with pytest.raises(UnsupportedFieldError) as caught:
        FieldSelector.parse(text)
    assert caught.value.field == field
    assert str(caught.value) == f'field selector "{field}" is not supported on sandboxes'
    assert caught.value.resource == "sandboxes"
    assert caught.value.allowed == SANDBOX_FIELDS
    assert isinstance(caught.value, InvalidValueError)
    assert isinstance(caught.value, SandboxctlError)


def test_allowed_fields_and_resource_word_are_parameters():
    allowed = frozenset({"spec.pool"})
    selector = FieldSelector.parse("spec.pool=warm", allowed=allowed, resource="pools")
    assert selector.matches({"spec.pool": "warm"})
    with pytest.raises(UnsupportedFieldError) as caught:
        FieldSelector.parse("metadata.name=x", allowed=allowed, resource="pools")
    assert str(caught.value) == 'field selector "metadata.name" is not supported on pools'
    assert caught.value.field == "metadata.name"


def test_default_allowed_fields_are_the_sandbox_fields():
    assert frozenset({"metadata.name", "metadata.namespace", "status.nodeName"}) == SANDBOX_FIELDS
    selector = FieldSelector.parse(
        "metadata.name=a,metadata.namespace=b,status.nodeName=c",
        allowed=frozenset({"metadata.name", "metadata.namespace", "status.nodeName"}),
    )
    assert len(selector.requirements) == 3


def test_syntax_errors_are_reported_before_unsupported_fields():
    with pytest.raises(InvalidValueError) as caught:
        FieldSelector.parse("spec.foo=1,metadata.name=a=b")
    assert not isinstance(caught.value, UnsupportedFieldError)


def test_field_selector_empty_property():
    assert FieldSelector.parse("").empty
    assert FieldSelector.parse(",,").empty
    assert FieldSelector().empty
    assert not FieldSelector.parse("metadata.name=").empty


def test_field_requirement_refuses_set_operators():
    with pytest.raises(InvalidValueError, match="support only = and !="):
        FieldRequirement("metadata.name", Operator.IN, "x")


# --- exact(): is the selector pinned to one value of a field? -------------------------------


@pytest.mark.parametrize(
    ("text", "field", "expected"),
    [
        ("metadata.name=web", "metadata.name", "web"),
        ("metadata.name==web", "metadata.name", "web"),
        ("metadata.name=web,metadata.namespace=default", "metadata.name", "web"),
        ("metadata.name=web,metadata.namespace=default", "metadata.namespace", "default"),
        ("metadata.name=web,status.nodeName!=n1", "metadata.name", "web"),
        ("metadata.name=a\\,b", "metadata.name", "a,b"),
        ("metadata.name=", "metadata.name", ""),
        ("metadata.name=a,metadata.name=a", "metadata.name", "a"),
        ("metadata.name=a,metadata.name==a", "metadata.name", "a"),
        ("metadata.name!=web", "metadata.name", None),
        ("metadata.name=a,metadata.name=b", "metadata.name", None),
        ("metadata.name=a,metadata.name!=b", "metadata.name", None),
        ("metadata.name=a,metadata.name!=a", "metadata.name", None),
        ("status.nodeName=n1", "metadata.name", None),
        ("", "metadata.name", None),
    ],
)
def test_exact(text: str, field: str, expected: str | None):
    assert FieldSelector.parse(text).exact(field) == expected


# --- properties -----------------------------------------------------------------------------

KEYS = ["a", "b", "in", "app", PHASE, "example.com/Tier_1"]
VALUES = ["", "x", "y", "in", "notin", "0", "7", "42", "v-1.2_Z"]
NUMBERS = ["0", "7", "42", "007"]
label_sets = st.dictionaries(st.sampled_from(KEYS), st.sampled_from([*VALUES, "-3", "+9"]))


@st.composite
def raw_requirements(draw: st.DrawFn) -> tuple[str, Operator, tuple[str, ...]]:
    key = draw(st.sampled_from(KEYS))
    operator = draw(st.sampled_from(list(Operator)))
    if operator in (Operator.EXISTS, Operator.DOES_NOT_EXIST):
        values: tuple[str, ...] = ()
    elif operator in (Operator.GREATER_THAN, Operator.LESS_THAN):
        values = (draw(st.sampled_from(NUMBERS)),)
    elif operator in (Operator.IN, Operator.NOT_IN):
        values = tuple(draw(st.lists(st.sampled_from(VALUES), min_size=1, max_size=4)))
    else:
        values = (draw(st.sampled_from(VALUES)),)
    return key, operator, values


def oracle(raw: tuple[str, Operator, tuple[str, ...]], labels: Labels) -> bool:
    """The Kubernetes rule for one requirement, written out independently."""
    key, operator, values = raw
    if operator is Operator.EXISTS:
        return key in labels
    if operator is Operator.DOES_NOT_EXIST:
        return key not in labels
    if operator in (Operator.EQUALS, Operator.IN):
        return key in labels and labels[key] in values
    if operator in (Operator.NOT_EQUALS, Operator.NOT_IN):
        return key not in labels or labels[key] not in values
    if key not in labels:
        return False
    try:
        have = int(labels[key])
    except ValueError:
        return False
    if not labels[key].lstrip("+-").isdigit():
        return False
    want = int(values[0])
    return have > want if operator is Operator.GREATER_THAN else have < want


@fast
@given(st.lists(raw_requirements(), max_size=5), st.lists(label_sets, min_size=1, max_size=5))
def test_rendered_selector_reparses_to_one_that_matches_the_same_labels(
    raws: list[tuple[str, Operator, tuple[str, ...]]], samples: list[Labels]
):
    selector = LabelSelector(tuple(LabelRequirement(*raw) for raw in raws))
    again = LabelSelector.parse(str(selector))
    assert again == selector
    assert str(again) == str(selector)
    for labels in samples:
        expected = all(oracle(raw, labels) for raw in raws)
        assert selector.matches(labels) == expected
        assert again.matches(labels) == expected


whitespace = st.text(alphabet=" \t\r\n", max_size=2)


@st.composite
def spaced_renderings(draw: st.DrawFn) -> tuple[str, LabelSelector]:
    """A selector written with whitespace wherever Kubernetes allows it."""
    raws = draw(st.lists(raw_requirements(), max_size=4))
    parts = []
    for key, operator, values in raws:
        ws = [draw(whitespace) for _ in range(4)]
        if operator is Operator.EXISTS:
            parts.append(f"{ws[0]}{key}{ws[1]}")
        elif operator is Operator.DOES_NOT_EXIST:
            parts.append(f"{ws[0]}!{ws[1]}{key}{ws[2]}")
        elif operator in (Operator.IN, Operator.NOT_IN):
            # Written as a person would: each value once, in order. Repeated empty values
            # ("a in (,,)") are not valid Kubernetes syntax, so they are not generated.
            unique = LabelRequirement(key, operator, values).values
            listed = f"{ws[2]},{ws[2]}".join(unique)
            word = operator.value
            gap = ws[1] or " "
            parts.append(f"{ws[0]}{key}{gap}{word}{ws[2]}({ws[3]}{listed}{ws[3]}){ws[0]}")
        else:
            symbol = {"=": draw(st.sampled_from(["=", "=="])), "gt": ">", "lt": "<"}.get(
                operator.value, operator.value
            )
            parts.append(f"{ws[0]}{key}{ws[1]}{symbol}{ws[2]}{values[0]}{ws[3]}")
    text = ",".join(parts)
    return text, LabelSelector(tuple(LabelRequirement(*raw) for raw in raws))


@fast
@given(spaced_renderings())
def test_whitespace_between_tokens_changes_nothing(case: tuple[str, LabelSelector]):
    text, expected = case
    assert LabelSelector.parse(text) == expected


def test_equality_operators_agree_with_single_value_sets():
    for labels in [{}, {"a": "x"}, {"a": "y"}, {"a": ""}]:
        for equal, member in [("a=x", "a in (x)"), ("a!=x", "a notin (x)")]:
            assert LabelSelector.parse(equal).matches(labels) == LabelSelector.parse(
                member
            ).matches(labels)


field_names = st.sampled_from(sorted(SANDBOX_FIELDS))
field_values = st.text(alphabet=st.sampled_from("ab,=\\!é \t"), max_size=6) | st.text(max_size=6)


@fast
@given(
    st.lists(
        st.tuples(
            field_names, st.sampled_from([Operator.EQUALS, Operator.NOT_EQUALS]), field_values
        ),
        max_size=4,
    ),
    st.lists(st.dictionaries(field_names, field_values), min_size=1, max_size=4),
)
def test_field_selector_escaping_round_trips_any_value(
    raws: list[tuple[str, Operator, str]], samples: list[Labels]
):
    selector = FieldSelector(tuple(FieldRequirement(*raw) for raw in raws))
    again = FieldSelector.parse(str(selector))
    assert again == selector
    for fields in samples:
        expected = all(
            (fields.get(field, "") == value) == (operator is Operator.EQUALS)
            for field, operator, value in raws
        )
        assert again.matches(fields) == expected

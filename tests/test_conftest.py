"""What tests/conftest.py relies on of pytest's internals, so that a pytest upgrade that
moves them fails here, naming what moved, instead of quietly running every stack on every
xdist worker (or never stopping one): an item's ``_fixtureinfo.name2fixturedefs`` and
``_request``, a fixture definition's ``scope``, ``func`` and ``finish(request)``. And that
the grouping really groups, marks and stops a stack after its group's last test."""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import conftest

pytest_plugins = ("pytester",)

_stopped: list[str] = []


@pytest.fixture(scope="session")
def probe_stack() -> Iterator[str]:
    """A session-scoped stack of this module: conftest groups its tests by it."""
    yield "started"
    _stopped.append("probe_stack")


def test_an_item_still_has_the_internals_conftest_reads(request: pytest.FixtureRequest) -> None:
    item = request.node
    assert isinstance(item, pytest.Function)
    fixtureinfo = getattr(item, "_fixtureinfo", None)
    assert fixtureinfo is not None, "pytest.Function._fixtureinfo is gone"
    definitions = getattr(fixtureinfo, "name2fixturedefs", None)
    assert isinstance(definitions, dict), "_fixtureinfo.name2fixturedefs is no longer a dict"
    assert "request" in item.fixturenames
    assert hasattr(item, "_request"), "pytest.Function._request is gone"


def test_a_fixture_definition_still_has_scope_func_and_finish(
    request: pytest.FixtureRequest, probe_stack: str
) -> None:
    (definition,) = request.node._fixtureinfo.name2fixturedefs["probe_stack"]
    assert isinstance(definition, pytest.FixtureDef)
    assert definition.scope == "session", "pytest.FixtureDef.scope is no longer the scope's name"
    assert definition.func.__module__ == __name__, "pytest.FixtureDef.func is not the fixture"
    parameters = list(inspect.signature(pytest.FixtureDef.finish).parameters)
    assert parameters == ["self", "request"], f"pytest.FixtureDef.finish takes {parameters} now"


def test_a_stack_user_is_marked_with_its_stack_and_the_stack_stops_on_finish(
    request: pytest.FixtureRequest, probe_stack: str
) -> None:
    item = request.node
    assert [definition.argname for definition in conftest._stacks(item)] == ["probe_stack"]
    marker = item.get_closest_marker("xdist_group")
    assert marker is not None, "pytest_collection_modifyitems did not mark the item"
    assert marker.args == (__name__,), "a stack's tests are grouped by the stack's module"
    assert "services" in conftest.needs_of(item)
    before = len(_stopped)
    for definition in conftest._stacks(item):
        definition.finish(item._request)
    assert _stopped[before:] == ["probe_stack"], "pytest.FixtureDef.finish did not stop the stack"


def test_a_test_without_a_stack_needs_nothing_and_is_grouped_by_its_module(
    request: pytest.FixtureRequest,
) -> None:
    item = request.node
    assert conftest._stacks(item) == []
    assert conftest.needs_of(item) == frozenset()
    marker = item.get_closest_marker("xdist_group")
    assert marker is not None
    assert marker.args == (item.nodeid.split("::")[0],)


def test_a_stacks_tests_run_together_and_it_stops_after_the_last(
    pytester: pytest.Pytester,
) -> None:
    """In a session of its own (a package named ``tests``, as conftest expects): the tests
    of one stack run one after another, whatever their files' order, and the stack stops
    before the next group's first test, not at the session's end."""
    package = pytester.mkpydir("tests")
    # Without the shared fixtures it imports from the real suite's packages (the control
    # plane's), which the inner package does not have: the grouping needs none of them.
    own = re.sub(
        r"^from tests\.testing\.\w+ import \([^)]*\)\n", "", Path(conftest.__file__).read_text(),
        flags=re.M,
    )  # fmt: skip
    (package / "conftest.py").write_text(
        own
        + textwrap.dedent(
            """

            @pytest.fixture(scope="session")
            def stack():
                print("@stack started")
                yield
                print("@stack stopped")
            """
        )
    )
    for name, uses_stack in (("a", True), ("b", False), ("c", True)):
        argument = "stack" if uses_stack else ""
        (package / f"test_{name}.py").write_text(
            f"def test_{name}({argument}):\n    print('@test {name}')\n"
        )
    pytester.makeini(
        """
        [pytest]
        filterwarnings = error
        markers =
            root
            netns
            services
            xdist_group
        """
    )
    # A process of its own: its package ``tests`` must not meet this session's.
    result = pytester.runpytest_subprocess(
        "-s", "--import-mode=importlib", *(f"-pno:{name}" for name in UNNEEDED_PLUGINS)
    )
    result.assert_outcomes(passed=3)
    said = re.findall(r"@(\w+ \w+)", result.stdout.str())
    assert said == ["stack started", "test a", "test c", "stack stopped", "test b"]


# Plugins the inner session does without (they take most of its start-up).
UNNEEDED_PLUGINS = ("cacheprovider", "xdist", "schemathesis", "hypothesispytest", "anyio")

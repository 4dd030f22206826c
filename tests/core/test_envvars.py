"""The rule for a sandbox's env vars, shared by the host agent and the e2b API."""

from __future__ import annotations

import pytest

from sandboxctl.core.envvars import MAX_ENV_BYTES, MAX_ENV_VARS, check_env
from sandboxctl.core.errors import InvalidValueError


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"FOO": "bar", "_": "", "a1_B2": "any = 'text'\n with newlines"},
        {f"V{i}": "" for i in range(MAX_ENV_VARS)},
        {"A": "v" * (MAX_ENV_BYTES - 1)},
        {"A": "é" * ((MAX_ENV_BYTES - 1) // 2)},
    ],
)
def test_accepted(env: dict[str, str]) -> None:
    check_env(env)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"1X": "v"}, "env: '1X' is not a variable name"),
        ({"A-B": "v"}, "env: 'A-B' is not a variable name"),
        ({"A=B": "v"}, "env: 'A=B' is not a variable name"),
        ({"": "v"}, "env: '' is not a variable name"),
        ({"NAÏVE": "v"}, "env: 'NAÏVE' is not a variable name"),
        ({"A\n": "v"}, "env: 'A\\n' is not a variable name"),
        ({"A\0": "v"}, "env: 'A\\x00' is not a variable name"),
        ({"X" * 100 + "-": "v"}, "env: '" + "X" * 64 + "...' is not a variable name"),
        ({"A": "x\0y"}, "env.A: the value contains a NUL byte"),
        ({f"V{i}": "" for i in range(MAX_ENV_VARS + 1)}, "env: at most 256 variables"),
        ({"A": "v" * MAX_ENV_BYTES}, "env: at most 65536 bytes"),
        ({"A": "é" * (MAX_ENV_BYTES // 2)}, "env: at most 65536 bytes"),  # bytes, not chars
    ],
)
def test_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidValueError) as refused:
        check_env(env)
    assert str(refused.value).startswith(message)


def test_the_field_is_named_and_a_value_never_echoed() -> None:
    with pytest.raises(InvalidValueError) as refused:
        check_env({"TOKEN": "hunter2\0"}, "envVars")
    assert str(refused.value) == "envVars.TOKEN: the value contains a NUL byte"

"""A sandbox's environment variables: the one rule the host agent and the e2b API check.

The variables are given at create (claim) time and set by envd for every command started
in the sandbox. Values may be secrets, so no message here ever repeats one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from sandboxctl.core.errors import InvalidValueError

MAX_ENV_VARS: Final = 256
MAX_ENV_BYTES: Final = 64 << 10  # UTF-8 names plus values
_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SHOWN_NAME: Final = 64


def is_variable_name(name: str) -> bool:
    """Whether a shell can set ``name``: letters, digits and _, not starting with a digit."""
    return _NAME.fullmatch(name) is not None


def check_env(env: Mapping[str, str], field: str = "env") -> None:
    """Names a shell can use, values ``exec`` can pass, within the size bound.

    Raises InvalidValueError whose message starts with ``field``.
    """
    if len(env) > MAX_ENV_VARS:
        raise InvalidValueError(f"{field}: at most {MAX_ENV_VARS} variables")
    encoded = sum(len(name.encode()) + len(value.encode()) for name, value in env.items())
    if encoded > MAX_ENV_BYTES:
        raise InvalidValueError(f"{field}: at most {MAX_ENV_BYTES} bytes")
    for name, value in env.items():
        if not is_variable_name(name):
            shown = name if len(name) <= _SHOWN_NAME else name[:_SHOWN_NAME] + "..."
            raise InvalidValueError(
                f"{field}: {shown!r} is not a variable name (letters, digits and _, "
                "not starting with a digit)"
            )
        if "\0" in value:
            raise InvalidValueError(f"{field}.{name}: the value contains a NUL byte")

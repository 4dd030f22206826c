"""What a template name asks for: one rule for every API that claims a sandbox.

The e2b API (``templateID``) and the Sandbox API (the first container's ``image``) both
read a requested name through :func:`resolve`: an alias names its template and its size
(``base`` and ``code-interpreter-v1`` point at ``serve``'s template, whatever it is);
any other name is a template of its own, in size small, when a fresh node serves it.
So ``image: base`` claims what ``Sandbox.create()`` claims, on every fleet.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

DEFAULT_SIZE: Final = "small"
# alias -> (template, size); serve points them at its own template (fleet/template.py).
DEFAULT_ALIASES: Final[Mapping[str, tuple[str, str]]] = MappingProxyType(
    {"base": ("base", DEFAULT_SIZE), "code-interpreter-v1": ("base", DEFAULT_SIZE)}
)


@dataclass(frozen=True, slots=True)
class Resolved:
    """The template a requested name stands for, and the size it asks for."""

    template: str
    size: str
    alias: str | None = None  # the alias it was asked by, if any


def resolve(
    requested: str, aliases: Mapping[str, tuple[str, str]], served: Callable[[str], bool]
) -> Resolved | None:
    """An alias's template and size (whether served or not: the claim then says why),
    else the name itself, small, when ``served`` says a fresh node serves it; else None."""
    if requested in aliases:
        template, size = aliases[requested]
        return Resolved(template, size, requested)
    return Resolved(requested, DEFAULT_SIZE) if served(requested) else None


def template_of(requested: str, aliases: Mapping[str, tuple[str, str]]) -> str:
    """The template an alias names, else the name itself (no fleet read)."""
    return aliases[requested][0] if requested in aliases else requested

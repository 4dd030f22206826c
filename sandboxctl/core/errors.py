"""The sandboxctl exception tree.

SandboxctlError                 every error sandboxctl raises on purpose
├── InvalidValueError           a flag or argument value that does not parse (duration, time, ...)
├── ConfigurationError          settings that parse but must not run together
└── InventoryFormatError        a NodeInventory object that breaks the model

Each message is written for the person who must fix the input. The CLI prints it as one
line and exits 2; the API servers map it to a status code at their boundary.
"""

from __future__ import annotations


class SandboxctlError(Exception):
    """Root of every error sandboxctl raises on purpose."""


class InvalidValueError(SandboxctlError, ValueError):
    """A value (duration, timestamp, key) that does not parse."""


class ConfigurationError(SandboxctlError):
    """Settings that each parse but must not be used together, e.g. an unsafe window."""


class InventoryFormatError(SandboxctlError):
    """A NodeInventory object that breaks the model.

    ``where`` names the object (file and position, when known) and ``field`` the dotted
    path inside it, so the message points at the exact place to fix.
    """

    def __init__(self, field: str, problem: str, where: str = "") -> None:
        self.field = field
        self.problem = problem
        self.where = where
        super().__init__(self._render())

    def located(self, where: str) -> InventoryFormatError:
        """The same error, prefixed with where the object came from."""
        prefix = f"{where}: {self.where}" if self.where else where
        return InventoryFormatError(self.field, self.problem, prefix)

    def _render(self) -> str:
        place = f"{self.where}: " if self.where else ""
        field = f"{self.field}: " if self.field else ""
        return f"{place}{field}{self.problem}"

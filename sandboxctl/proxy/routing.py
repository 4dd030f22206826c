"""Which sandbox and port a request names (no I/O)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

INTERNAL_PATHS: Final = frozenset(
    {"/init", "/freeze", "/unfreeze", "/fsfreeze", "/fsthaw", "/collapse"}
)
NO_SANDBOX: Final = "no sandbox in the request host or headers"
_PORT: Final = re.compile(r"[0-9]{1,5}")


@dataclass(frozen=True, slots=True)
class Target:
    sandbox_id: str
    port: int


class BadRoute(Exception):
    """A 400: the request names no sandbox, or names a bad port."""


def route(headers: Mapping[str, str], domain: str) -> Target | None:
    """The sandbox the request names, or None when it names none.

    ``headers`` has lowercase names. ``E2b-Sandbox-Id`` (non-empty) with
    ``E2b-Sandbox-Port`` wins; otherwise the host must be ``{port}-{id}.{domain}``.
    Raises BadRoute for a port that is not a bare integer 1..65535."""
    sandbox_id = headers.get("e2b-sandbox-id", "").strip()
    if sandbox_id:
        return Target(sandbox_id, parse_port(headers.get("e2b-sandbox-port", "").strip()))
    host = _strip_port(headers.get("host", "").strip().lower())
    suffix = "." + domain.lower().strip(".")
    if not domain or not host.endswith(suffix):
        return None
    label = host[: -len(suffix)]
    if not label or "." in label:
        return None
    port_text, hyphen, sandbox_id = label.partition("-")
    if not hyphen or not sandbox_id:
        return None
    return Target(sandbox_id, parse_port(port_text))


def parse_port(text: str) -> int:
    if _PORT.fullmatch(text) is None or not 1 <= int(text) <= 65535:
        raise BadRoute(f"bad sandbox port {text!r}: want an integer 1-65535")
    return int(text)


def is_internal(path: str) -> bool:
    """envd paths only the orchestrator may call (trimmed, case-insensitive)."""
    return "/" + path.strip().strip("/").lower() in INTERNAL_PATHS


def _strip_port(host: str) -> str:
    if host.startswith("["):  # [v6]:port
        return host.partition("]")[0] + "]"
    name, colon, port = host.rpartition(":")
    return name if colon and port.isdigit() else host

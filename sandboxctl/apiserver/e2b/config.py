"""What the e2b-compatible API is configured with, and the two files that configure it.

The key file has one entry per line: ``key`` or ``key namespace`` (a key without a
namespace drives the default namespace). The alias file has ``alias template [size]``
per line. In both, ``#`` starts a comment and blank lines are skipped; anything else
that does not fit fails startup with a message naming the file and line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from sandboxctl.apiserver.templatenames import DEFAULT_ALIASES as DEFAULT_ALIASES  # re-exported
from sandboxctl.apiserver.templatenames import DEFAULT_SIZE
from sandboxctl.core.errors import ConfigurationError
from sandboxctl.core.model import DEFAULT_NAMESPACE

SIZES: Final = ("small", "medium", "large")
DEFAULT_TIMEOUT: Final = 300
# envd is not served yet; this is the version the create/connect answers report, the
# lowest one the SDK's flows accept without refusing options (see docs/e2b-compat.md).
DEFAULT_ENVD_VERSION: Final = "0.5.7"


@dataclass(frozen=True)
class E2bConfig:
    """The e2b API's settings. ``api_keys`` maps each key to the namespace it drives;
    ``aliases`` maps a template alias to (pool template, size)."""

    domain: str
    envd_secret: bytes
    api_keys: Mapping[str, str]
    allow_anonymous: bool = False
    namespace: str = DEFAULT_NAMESPACE
    default_timeout: int = DEFAULT_TIMEOUT
    envd_version: str = DEFAULT_ENVD_VERSION
    aliases: Mapping[str, tuple[str, str]] = field(default_factory=lambda: dict(DEFAULT_ALIASES))

    def __post_init__(self) -> None:
        if not self.domain:
            raise ConfigurationError("the e2b API needs a domain (--e2b-domain)")
        if not self.envd_secret:
            raise ConfigurationError("the e2b API needs an envd secret (--e2b-envd-secret-file)")
        if not self.api_keys and not self.allow_anonymous:
            raise ConfigurationError(
                "the e2b API needs API keys (--e2b-api-key-file) or --e2b-allow-anonymous"
            )
        if self.default_timeout <= 0:
            raise ConfigurationError("--e2b-default-timeout must be a positive number of seconds")


def load_api_keys(path: Path | str, namespace: str = DEFAULT_NAMESPACE) -> dict[str, str]:
    """Read a key file: key -> namespace (``namespace`` for a key given alone)."""
    keys: dict[str, str] = {}
    for number, fields in _lines(path):
        where = f"{path}:{number}"
        if len(fields) > 2:
            raise ConfigurationError(
                f"{where}: expected 'key' or 'key namespace', got {len(fields)} fields"
            )
        key = fields[0]
        if key in keys:
            raise ConfigurationError(f"{where}: duplicate API key")
        keys[key] = fields[1] if len(fields) == 2 else namespace
    return keys


def load_template_aliases(path: Path | str) -> dict[str, tuple[str, str]]:
    """Read an alias file: alias -> (template, size); size defaults to small."""
    aliases: dict[str, tuple[str, str]] = {}
    for number, fields in _lines(path):
        where = f"{path}:{number}"
        if len(fields) not in (2, 3):
            raise ConfigurationError(
                f"{where}: expected 'alias template [small|medium|large]', got "
                f"{len(fields)} field{'s' if len(fields) != 1 else ''}"
            )
        alias, template = fields[0], fields[1]
        size = fields[2] if len(fields) == 3 else DEFAULT_SIZE
        if size not in SIZES:
            raise ConfigurationError(f"{where}: size {size!r} is not one of {', '.join(SIZES)}")
        if alias in aliases:
            raise ConfigurationError(f"{where}: duplicate alias {alias!r}")
        aliases[alias] = (template, size)
    return aliases


def _lines(path: Path | str) -> list[tuple[int, list[str]]]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise ConfigurationError(f"{path}: {reason}") from error
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split("#", 1)[0].split()
        if fields:
            found.append((number, fields))
    return found

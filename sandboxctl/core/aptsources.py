"""Which Debian mirror a template build uses: the one this machine's apt is configured
with, read from its sources (``/etc/apt/sources.list`` and ``sources.list.d/*.list`` in
one-line style, ``sources.list.d/*.sources`` in deb822 style). Never another host.

An entry is Debian's when its URI's path ends in ``/debian`` or ``/debian-security`` (the
layout of every Debian mirror) or it is signed by Debian's archive keyring. A build of the
host's own suite gets the host's Debian entries for it (the suite, its ``-updates`` and
``-security``); a build of another suite gets the main archive's URI with that suite only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from sandboxctl.core.errors import ConfigurationError

DEBIAN_KEYRING: Final = "debian-archive-keyring"
DEBIAN_PATHS: Final = ("debian", "debian-security")
SUITE_KINDS: Final = ("", "-updates", "-security")


@dataclass(frozen=True, slots=True)
class AptSource:
    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]
    signed_by: str = ""

    @property
    def debian(self) -> bool:
        path = urlsplit(self.uri).path.rstrip("/")
        return path.rsplit("/", 1)[-1] in DEBIAN_PATHS or DEBIAN_KEYRING in self.signed_by

    @property
    def security(self) -> bool:
        path = urlsplit(self.uri).path.rstrip("/")
        return path.endswith("-security") or any(s.endswith("-security") for s in self.suites)


def parse_one_line(text: str) -> list[AptSource]:
    """``deb [options] URI SUITE [COMPONENT...]`` lines; ``deb-src`` and comments skipped."""
    found = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if not words or words[0] != "deb":
            continue
        options: dict[str, str] = {}
        rest = words[1:]
        if rest and rest[0].startswith("["):
            closing = next((i for i, word in enumerate(rest) if word.endswith("]")), None)
            if closing is None:
                continue
            for option in " ".join(rest[: closing + 1]).strip("[]").split():
                key, _, value = option.partition("=")
                options[key] = value
            rest = rest[closing + 1 :]
        if len(rest) < 2:
            continue
        found.append(AptSource(rest[0], (rest[1],), tuple(rest[2:]), options.get("signed-by", "")))
    return found


def parse_deb822(text: str) -> list[AptSource]:
    """Stanzas of ``Types``, ``URIs``, ``Suites``, ``Components``, ``Signed-By`` and
    ``Enabled``; only enabled ``deb`` stanzas count."""
    found = []
    for stanza in _stanzas(text):
        if "deb" not in stanza.get("types", "").split():
            continue
        if stanza.get("enabled", "yes").strip().lower() == "no":
            continue
        for uri in stanza.get("uris", "").split():
            found.append(
                AptSource(
                    uri,
                    tuple(stanza.get("suites", "").split()),
                    tuple(stanza.get("components", "").split()),
                    stanza.get("signed-by", ""),
                )
            )
    return found


def mirror_lines(sources: Iterable[AptSource], suite: str, where: str) -> list[str]:
    """The one-line sources a build of ``suite`` uses, from the host's ``sources``
    (``where`` names the files in the error when none is Debian's)."""
    debian = [source for source in sources if source.debian]
    wanted = {suite + kind for kind in SUITE_KINDS}
    if any(suite in source.suites for source in debian):
        return [
            _line(source.uri, name, source.components)
            for source in debian
            for name in source.suites
            if name in wanted
        ]
    archive = next((source for source in debian if not source.security), None)
    if archive is None:
        raise ConfigurationError(
            f"no Debian mirror in {where}: a template is built from the Debian mirror this "
            "machine's apt uses; add one (e.g. 'deb http://deb.debian.org/debian bookworm "
            "main' in /etc/apt/sources.list)"
        )
    return [_line(archive.uri, suite, archive.components)]


def _line(uri: str, suite: str, components: Sequence[str]) -> str:
    return " ".join(("deb", uri, suite, *(components or ("main",))))


def _stanzas(text: str) -> list[dict[str, str]]:
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    key = ""
    for raw in [*text.splitlines(), ""]:
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if current:
                stanzas.append(current)
            current, key = {}, ""
        elif raw[0] in " \t":
            if key:  # a continuation line (e.g. an inline Signed-By key)
                current[key] += "\n" + raw.strip()
        else:
            name, _, value = raw.partition(":")
            key = name.strip().lower()
            current[key] = value.strip()
    return stanzas

"""Templates built from Debian packages: what a build is made of (its spec), the rules its
inputs follow, and the digest that names it in a template store.

A build is content-addressed: two specs with the same suite, packages and run commands,
built by the same mmdebstrap with the same recipe, have the same digest, so the second
build is the first one found again. A template is a name for a build plus what runs at
sandbox start (its start and ready commands), which change no file and so no digest.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import dataclass, replace
from typing import Final

from sandboxctl.core.errors import InvalidValueError

DEFAULT_SUITE: Final = "bookworm"
# What the sandbox runtime runs inside every template: /bin/sh, bash (the SDK's
# commands), coreutils and setsid (pty job control) come with Debian's essential set;
# envd's filesystem calls (list, stat, rename, watch...) run a python3 helper.
REQUIRED_PACKAGES: Final = ("python3",)
# Bump when the recipe changes (variant, excluded paths): old builds stop matching.
RECIPE: Final = 1
HOST_ROOT: Final = "base"  # the host's own root filesystem: never a built template
# What ``serve`` builds on its first start and runs its sandboxes from: small, and what the
# e2b SDK's users reach for first (ps, top; TLS roots for python3's https).
DEFAULT_TEMPLATE: Final = "default"
DEFAULT_PACKAGES: Final = ("ca-certificates", "procps")
# How long a new sandbox of a template may take to pass its ready command.
READY_TIMEOUT: Final = 60.0
MAX_RUN_COMMANDS: Final = 64
MAX_COMMAND_BYTES: Final = 16 << 10

_LABEL: Final = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_PACKAGE: Final = re.compile(r"[a-z0-9][a-z0-9+.-]+")  # Debian policy 5.6.1
_SUITE: Final = re.compile(r"[a-z][a-z0-9.-]{0,63}")
_DIGEST: Final = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class TemplateSpec:
    """What a build installs. ``packages`` is sorted, without repeats, and holds the
    required ones; ``run`` is in the order the commands run (as root, in the new root)."""

    suite: str = DEFAULT_SUITE
    packages: tuple[str, ...] = REQUIRED_PACKAGES
    run: tuple[str, ...] = ()

    def base(self) -> TemplateSpec:
        """The same packages without the run commands: the layer they run on."""
        return replace(self, run=())

    def digest(self, tool: str) -> str:
        """64 hex digits naming the build of this spec by ``tool`` (e.g. "mmdebstrap
        1.3.5") with this recipe."""
        canonical = json.dumps(
            {
                "recipe": RECIPE,
                "tool": tool,
                "suite": self.suite,
                "packages": list(self.packages),
                "run": list(self.run),
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(canonical.encode()).hexdigest()


def template_spec(
    suite: str = DEFAULT_SUITE, packages: tuple[str, ...] = (), run: tuple[str, ...] = ()
) -> TemplateSpec:
    """A checked spec (InvalidValueError names the bad value); the required packages are
    added to ``packages``."""
    if not _SUITE.fullmatch(suite):
        raise InvalidValueError(
            f"--suite {suite!r}: not a Debian suite name (e.g. {DEFAULT_SUITE}, trixie, stable)"
        )
    for package in packages:
        if not _PACKAGE.fullmatch(package):
            raise InvalidValueError(
                f"--packages: {package!r} is not a Debian package name (lowercase letters, "
                "digits, '+', '-' and '.', at least two characters)"
            )
    if len(run) > MAX_RUN_COMMANDS:
        raise InvalidValueError(f"--run: at most {MAX_RUN_COMMANDS} commands")
    for command in run:
        check_command("--run", command)
    return TemplateSpec(suite, tuple(sorted({*REQUIRED_PACKAGES, *packages})), run)


def default_spec() -> TemplateSpec:
    """The spec of ``serve``'s default template."""
    return template_spec(DEFAULT_SUITE, DEFAULT_PACKAGES)


def check_command(flag: str, command: str) -> str:
    """A shell command line a template runs: not blank, no NUL byte, bounded."""
    if not command.strip():
        raise InvalidValueError(f"{flag}: the command is empty")
    if "\0" in command:
        raise InvalidValueError(f"{flag}: the command contains a NUL byte")
    if len(command.encode()) > MAX_COMMAND_BYTES:
        raise InvalidValueError(f"{flag}: the command is over {MAX_COMMAND_BYTES} bytes")
    return command


def check_template_name(name: str) -> str:
    """A template name is a DNS label, and not the host root's."""
    if not _LABEL.fullmatch(name):
        raise InvalidValueError(
            f"template name {name!r} is not a DNS label: 1 to 63 lowercase letters, digits "
            "and '-', starting and ending with a letter or digit"
        )
    if name == HOST_ROOT:
        raise InvalidValueError(
            f"template name {HOST_ROOT!r} is the host's root filesystem; pick another name"
        )
    return name


def split_packages(text: str) -> tuple[str, ...]:
    """``--packages a,b c``: names separated by commas or spaces."""
    return tuple(name for name in re.split(r"[,\s]+", text) if name)


def is_digest(text: str) -> bool:
    return bool(_DIGEST.fullmatch(text))


def build_id(digest: str) -> str:
    """The build's id as e2b spells one (a UUID): the digest's first 128 bits."""
    return str(uuid.UUID(digest[:32]))


def format_mib(size_bytes: int) -> str:
    """A size on disk as ``155.8 MiB``."""
    return f"{size_bytes / (1 << 20):.1f} MiB"

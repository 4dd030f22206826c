"""Files that hold secrets: read one a flag names, create one on first use, replace one
atomically. Every file written here is mode 0600 from its first byte."""

from __future__ import annotations

import logging
import os
import stat
import tempfile
from pathlib import Path

from sandboxctl.core.errors import ConfigurationError

log = logging.getLogger("sandboxctl")


def read_secret(flag: str, path: Path) -> str:
    """A secret from a file named by ``flag``: whitespace trimmed, an empty file refused."""
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except OSError as error:
        raise ConfigurationError(f"{flag} {path}: {error.strerror}") from error
    if not secret:
        raise ConfigurationError(f"{flag} {path}: the file is empty")
    return secret


def create_secret(path: Path, text: str) -> str:
    """The file's trimmed text; a missing file is created first with ``text``. An existing
    file others may read is kept, with a warning."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            log.warning("%s is readable by others (mode %04o); chmod 600 it", path, mode)
    else:
        with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
            stream.write(text)
        log.info("created %s", path)
    return read_secret(str(path), path)


def write_private(target: Path, text: str, sync: bool = True) -> None:
    """Replace ``target`` with ``text`` at once: a reader sees the old file or the new one,
    never a part, and never a moment of a wider mode. ``sync=False`` skips the fsync, for
    a file that means nothing after the host's crash or reboot."""
    descriptor, scratch = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
            os.fchmod(stream.fileno(), 0o600)
            stream.write(text)
            stream.flush()
            if sync:
                os.fsync(stream.fileno())
        os.replace(scratch, target)
    except BaseException:
        Path(scratch).unlink(missing_ok=True)
        raise

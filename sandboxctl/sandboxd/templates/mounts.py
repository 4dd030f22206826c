"""What the kernel's mount tables say about a template's directories: whether a sandbox
still has one bound (``users_of``), and removing a tree without descending into a mount
a killed build left in it (``remove_tree``: mmdebstrap mounts /proc, /sys and /dev into
the root it builds)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sandboxctl.core.errors import ConfigurationError


@dataclass(frozen=True, slots=True)
class Mount:
    device: str  # "major:minor"
    root: str  # the mounted directory, within its filesystem
    point: str  # where it is mounted


def mounts(pid: int | str = "self") -> list[Mount]:
    """The mounts of ``pid``'s mount namespace (``/proc/PID/mountinfo``)."""
    found = []
    with open(f"/proc/{pid}/mountinfo", encoding="utf-8", errors="surrogateescape") as table:
        for line in table:
            fields = line.split()
            found.append(Mount(fields[2], _unescape(fields[3]), _unescape(fields[4])))
    return found


def users_of(path: Path) -> list[int]:
    """One pid per mount namespace that has ``path`` (or a directory in it) mounted, such
    as a sandbox whose root it is; [] when none does."""
    target = str(path.resolve())
    here = [m for m in mounts() if _within(target, m.point)]
    if not here:
        return []
    holder = max(here, key=lambda m: len(m.point))  # the filesystem ``path`` is on
    inside = os.path.join(holder.root, os.path.relpath(target, holder.point))
    inside = os.path.normpath(inside)
    users = []
    own = _namespace("self")
    seen = {own}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        namespace = _namespace(entry)
        if namespace is None or namespace in seen:
            continue
        seen.add(namespace)
        try:
            table = mounts(entry)
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if any(m.device == holder.device and _within(m.root, inside) for m in table):
            users.append(int(entry))
    return users


def remove_tree(path: Path) -> None:
    """Remove ``path`` and everything in it, after detaching any mount below it (never
    deleting through a mount into /dev or /proc). ConfigurationError if one stays."""
    target = str(path.resolve())
    below = sorted({m.point for m in mounts() if _within(m.point, target)}, key=len, reverse=True)
    for point in below:
        subprocess.run(["umount", "--lazy", point], check=False, capture_output=True)
    left = [m.point for m in mounts() if _within(m.point, target)]
    if left:
        raise ConfigurationError(f"{path}: cannot unmount {left[0]}; not removing it")
    shutil.rmtree(path, ignore_errors=True)  # fd-based: symlinks inside are not followed


def _namespace(pid: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for escaped, plain in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escaped, plain)
    return field

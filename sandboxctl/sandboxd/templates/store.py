"""A template store: built root filesystems by digest, and template names pointing at them.

::

    STORE/                          0711  default /var/lib/sandboxctl/templates
    STORE/.lock                     0600  held by a build or a removal
    STORE/builds/DIGEST/            0711  one build, named by the digest of its spec
    STORE/builds/DIGEST/root/       0755  its root filesystem, bound read-only into sandboxes
    STORE/builds/DIGEST/build.json  0644  its spec and what the build measured
    STORE/templates/NAME.json       0644  a template: its build, start and ready commands
    STORE/.build-XXXXXXXX/                a build in progress, renamed to builds/DIGEST when
                                          done; a leftover is removed by the next build

Sandbox uids must traverse down to each ``root`` (bubblewrap binds it as the sandbox's
uid), and nothing but root may write anywhere in it. Every change is a rename, so an
agent reading the store never sees half a build or half a template.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sandboxctl.core.errors import ConfigurationError, InvalidValueError
from sandboxctl.core.templates import is_digest
from sandboxctl.sandboxd.runtimedir import shared_path_problem
from sandboxctl.sandboxd.templates.mounts import remove_tree

log = logging.getLogger("sandboxctl.templates")

DEFAULT_STORE = Path("/var/lib/sandboxctl/templates")
STORE_ENV = "SANDBOXCTL_TEMPLATE_STORE"
BUILDS = "builds"
NAMES = "templates"
ROOT = "root"
BUILD_FILE = "build.json"
LOCK_FILE = ".lock"
SCRATCH_PREFIX = ".build-"


@dataclass(frozen=True, slots=True)
class Build:
    """One built root filesystem: its spec, and what building it took."""

    digest: str
    suite: str
    packages: tuple[str, ...]
    run: tuple[str, ...]
    base: str  # the digest of the packages-only build the run commands ran on, or ""
    tool: str  # "mmdebstrap 1.3.5"
    mirror: tuple[str, ...]  # the sources it was built from
    created_at: float  # unix seconds
    build_seconds: float
    size_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "packages": list(self.packages), "run": list(self.run)}

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Build:
        return cls(
            digest=str(body["digest"]),
            suite=str(body["suite"]),
            packages=tuple(map(str, body["packages"])),
            run=tuple(map(str, body["run"])),
            base=str(body.get("base") or ""),
            tool=str(body["tool"]),
            mirror=tuple(map(str, body.get("mirror") or ())),
            created_at=float(body["created_at"]),
            build_seconds=float(body["build_seconds"]),
            size_bytes=int(body["size_bytes"]),
        )


@dataclass(frozen=True, slots=True)
class Template:
    """A name for a build, with what runs in each of its sandboxes at start."""

    name: str
    build: Build
    root: Path
    start_cmd: str = ""
    ready_cmd: str = ""
    named_at: float = 0.0


class TemplateStore:
    """Reads need no lock (every change is a rename); changes hold ``locked()``."""

    def __init__(self, path: Path) -> None:
        self.path = path.absolute()
        self.builds = self.path / BUILDS
        self.names = self.path / NAMES

    # --- reads -----------------------------------------------------------------------------

    def version(self) -> tuple[int, int] | None:
        """Changes whenever a template is named or removed (the names dir's inode and
        mtime); None when the store has none."""
        try:
            info = self.names.stat()
        except OSError:
            return None
        return info.st_ino, info.st_mtime_ns

    def templates(self) -> list[Template]:
        """Every template whose build is here, sorted by name."""
        try:
            files = sorted(self.names.glob("*.json"))
        except OSError:
            return []
        found = []
        for file in files:
            template = self.get(file.stem)
            if template is not None:
                found.append(template)
        return found

    def get(self, name: str) -> Template | None:
        try:
            body = json.loads((self.names / f"{name}.json").read_text())
            build = self.build(str(body["build"]))
            if build is None:
                log.warning("template %s: its build %s is gone from %s", name, body["build"], self)
                return None
            return Template(
                name=name,
                build=build,
                root=self.root_of(build.digest),
                start_cmd=str(body.get("start_cmd") or ""),
                ready_cmd=str(body.get("ready_cmd") or ""),
                named_at=float(body.get("named_at") or build.created_at),
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as error:
            log.warning("template %s in %s cannot be read: %s", name, self, error)
            return None

    def build(self, digest: str) -> Build | None:
        if not is_digest(digest):
            return None
        try:
            return Build.from_json(json.loads((self.builds / digest / BUILD_FILE).read_text()))
        except FileNotFoundError:
            return None

    def root_of(self, digest: str) -> Path:
        return self.builds / digest / ROOT

    def __str__(self) -> str:
        return str(self.path)

    # --- changes (under the lock) ------------------------------------------------------------

    @contextlib.contextmanager
    def locked(self) -> Iterator[int]:
        """The store's lock (made, with the store, if missing), then leftovers of a build
        that was killed are removed: whoever holds the lock is the only builder. Yields
        the lock's fd: a builder passes it to what it runs, so that a build process that
        outlives a killed sandboxctl keeps the store locked until it is done."""
        self.prepare()
        with (self.path / LOCK_FILE).open("a") as lock:
            os.fchmod(lock.fileno(), 0o600)
            fcntl.flock(lock, fcntl.LOCK_EX)
            for leftover in self.path.glob(f"{SCRATCH_PREFIX}*"):
                log.info("removing %s, a build that did not finish", leftover)
                remove_tree(leftover)
            yield lock.fileno()

    def prepare(self) -> None:
        """The store's directories, root's, that sandbox uids may only traverse."""
        for directory, mode in ((self.path, 0o711), (self.builds, 0o711), (self.names, 0o755)):
            directory.mkdir(mode=mode, parents=True, exist_ok=True)
            directory.chmod(mode)

    def scratch(self) -> Path:
        """An empty directory beside the builds, for one build to fill and ``commit``."""
        path = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=self.path))
        path.chmod(0o711)
        return path

    def commit(self, scratch: Path, build: Build) -> None:
        """Write the build's metadata into ``scratch`` (which holds ``root``) and move it
        into place at once."""
        _write_json(scratch / BUILD_FILE, build.to_json())
        os.rename(scratch, self.builds / build.digest)

    def name(self, name: str, digest: str, start_cmd: str, ready_cmd: str, now: float) -> Template:
        """Point ``name`` at a build here (replacing what it named), atomically."""
        body = {"build": digest, "start_cmd": start_cmd, "ready_cmd": ready_cmd, "named_at": now}
        _write_json(self.names / f"{name}.json", body)
        template = self.get(name)
        if template is None:
            raise InvalidValueError(f"template {name!r}: build {digest} is not in {self}")
        return template

    def unneeded_without(self, name: str) -> list[Build]:
        """The builds no template would need once ``name`` is gone (neither directly nor
        as the packages build its run commands ran on)."""
        needed: set[str] = set()
        for template in self.templates():
            if template.name != name:
                needed.update(d for d in (template.build.digest, template.build.base) if d)
        try:
            entries = sorted(self.builds.iterdir())
        except FileNotFoundError:
            return []
        unneeded = (self.build(e.name) for e in entries if e.name not in needed)
        return [build for build in unneeded if build is not None]

    def remove(self, name: str) -> list[Build]:
        """Drop the name, then every build no template needs any more; returns those."""
        doomed = self.unneeded_without(name)
        (self.names / f"{name}.json").unlink()
        for build in doomed:
            # Moved aside first: an agent reading the store never sees half a build.
            aside = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=self.path))
            os.rename(self.builds / build.digest, aside / build.digest)
            remove_tree(aside)
        return doomed


def size_on_disk(path: Path) -> int:
    """Bytes a tree takes on disk (allocated blocks, each inode once), as ``du`` counts."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for directory, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            info = os.lstat(os.path.join(directory, name))
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
    return total


def _write_json(path: Path, body: dict[str, Any]) -> None:
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    scratch.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
    scratch.chmod(0o644)
    os.replace(scratch, path)


def check_store(path: Path, flag: str) -> None:
    """Refuse (ConfigurationError) a store sandbox uids cannot traverse down to, or that
    someone other than root could change. Writes nothing."""
    problem = shared_path_problem(path)
    if problem:
        raise ConfigurationError(
            f"{flag} {path}: {problem}; keep templates where every uid may traverse and only "
            f"root may write ({flag} or {STORE_ENV}; default {DEFAULT_STORE})"
        )

"""Every template one agent serves, by name: the host's root as ``base`` (unless turned
off), each ``--template NAME=DIR``, and every template in its template store, read again
whenever the store changes (a template built while the agent runs is served at once).
A ``--template`` directory wins over a store template of the same name."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from sandboxctl.core.templates import HOST_ROOT
from sandboxctl.sandboxd.templates.store import Build, TemplateStore


@dataclass(frozen=True, slots=True)
class Served:
    name: str
    root: Path
    start_cmd: str = ""
    ready_cmd: str = ""
    build: Build | None = None  # None: the host root or a --template directory


class Catalog(Mapping[str, Path]):
    """Template name -> its read-only root; ``served`` has the rest. Thread-safe."""

    def __init__(
        self, fixed: Mapping[str, Path], store: Path | None = None, host_root: bool = True
    ) -> None:
        roots = {HOST_ROOT: Path("/")} if host_root else {}
        self._fixed = {name: Served(name, root) for name, root in {**roots, **fixed}.items()}
        self.store = TemplateStore(store) if store is not None else None
        self._lock = threading.Lock()
        self._seen: object = None
        self._from_store: dict[str, Served] = {}

    def served(self, name: str) -> Served | None:
        return self._current().get(name)

    def every(self) -> list[Served]:
        return [served for _, served in sorted(self._current().items())]

    def __getitem__(self, name: str) -> Path:
        return self._current()[name].root

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._current()))

    def __len__(self) -> int:
        return len(self._current())

    def _current(self) -> dict[str, Served]:
        if self.store is None:
            return self._fixed
        seen = _stamp(self.store.names)
        with self._lock:
            if seen != self._seen:
                self._from_store = {
                    t.name: Served(t.name, t.root, t.start_cmd, t.ready_cmd, t.build)
                    for t in self.store.templates()
                }
                self._seen = seen
            return {**self._from_store, **self._fixed}


def _stamp(directory: Path) -> object:
    """Changes whenever a template file is added, replaced (a new inode) or removed."""
    try:
        with os.scandir(directory) as entries:
            return sorted((e.name, e.inode(), e.stat().st_mtime_ns) for e in entries)
    except OSError:
        return None

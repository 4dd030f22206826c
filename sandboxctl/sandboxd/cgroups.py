"""One set of cgroups per sandbox: cgroup v1 limits, the v2 freezer and kill switch.

Layout, for sandbox ``ID`` and parent ``sandboxctl``::

    /sys/fs/cgroup/memory/sandboxctl/ID    memory.limit_in_bytes (+ memory.memsw.limit_in_bytes)
    /sys/fs/cgroup/pids/sandboxctl/ID      pids.max
    /sys/fs/cgroup/cpu/sandboxctl/ID       cpu.cfs_quota_us = cpus * cpu.cfs_period_us
    /sys/fs/cgroup/freezer/sandboxctl/ID   freezer.state (used when there is no v2 freezer)
    /sys/fs/cgroup/unified/sandboxctl/ID   cgroup.freeze, cgroup.kill (v2, no controllers)
    /sys/fs/cgroup/cpuacct/sandboxctl/ID   cpuacct.usage: CPU time, for the usage samples

Memory and pids are required; cpu, the v1 freezer and the v2 directory are used when
the host has them (at least one freezer is required). Every process of a sandbox is
born inside these cgroups: the launcher is a shell that writes its own pid into each
``cgroup.procs`` and then execs the real command (:func:`join_command`), so no process
ever runs outside them, and a sandbox uid cannot move itself out (the files are root's).

The cpuacct group only counts (see :meth:`Cgroups.usage`): joining it is best effort, so
a sandbox started before it existed (adopted from an older agent) still runs commands.

A pure cgroup v2 host (no v1 hierarchies) is not supported yet: the runtime then falls
back to rlimits.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import shlex
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sandboxctl.sandboxd import procfs
from sandboxctl.sandboxd.runtime import Limits, RuntimeFailure

CGROUP_ROOT = Path("/sys/fs/cgroup")
REQUIRED_V1 = ("memory", "pids")
OPTIONAL_V1 = ("cpu", "freezer")
ACCOUNTING = "cpuacct"
UNIFIED = "unified"


@dataclass(frozen=True, slots=True)
class CgroupUsage:
    """What a sandbox's cgroups have counted: CPU time (None without cpuacct), memory in
    use without the reclaimable page cache, and that cache."""

    cpu_ns: int | None
    memory_bytes: int
    cache_bytes: int


class Cgroups:
    """The cgroups of every sandbox under ``parent`` (one directory per controller)."""

    def __init__(self, root: Path = CGROUP_ROOT, parent: str = "sandboxctl") -> None:
        if not parent or "/" in parent or parent in (".", ".."):
            raise ValueError(f"cgroup parent must be one path component, got {parent!r}")
        self.root = root
        self.parent = parent
        self._controllers: tuple[str, ...] | None = None
        self._unified = False
        self._accounting = False
        self.reason = ""  # why cgroups are unavailable, once detected

    # --- detection -----------------------------------------------------------------------

    def available(self) -> bool:
        """Whether this host lets us make the cgroups we need; detected once."""
        if self._controllers is None:
            self._controllers = self._detect()
        return bool(self._controllers)

    def _detect(self) -> tuple[str, ...]:
        found: list[str] = []
        for controller in (*REQUIRED_V1, *OPTIONAL_V1):
            base = self.root / controller
            if not (base / "cgroup.procs").is_file() or (base / "cgroup.controllers").exists():
                if controller in REQUIRED_V1:
                    self.reason = f"no cgroup v1 {controller} hierarchy at {base}"
                    return ()
                continue
            try:
                (base / self.parent).mkdir(exist_ok=True)
            except OSError as exc:
                if controller in REQUIRED_V1:
                    self.reason = f"cannot create {base / self.parent}: {exc.strerror}"
                    return ()
                continue
            found.append(controller)
        unified = self.root / UNIFIED
        if (unified / "cgroup.controllers").is_file():
            with contextlib.suppress(OSError):
                (unified / self.parent).mkdir(exist_ok=True)
                self._unified = (unified / self.parent / "cgroup.freeze").is_file()
        if not self._unified and "freezer" not in found:
            self.reason = "neither a cgroup v2 freezer nor a v1 freezer hierarchy"
            return ()
        accounting = self.root / ACCOUNTING
        if (accounting / "cgroup.procs").is_file():
            with contextlib.suppress(OSError):
                (accounting / self.parent).mkdir(exist_ok=True)
                self._accounting = True
        return tuple(found)

    @property
    def controllers(self) -> tuple[str, ...]:
        """The v1 controllers in use (empty when unavailable)."""
        self.available()
        assert self._controllers is not None
        return self._controllers

    @property
    def freezer(self) -> str:
        """Which freezer ``freeze`` uses: "cgroup-v2" or "cgroup-v1"."""
        self.available()
        return "cgroup-v2" if self._unified else "cgroup-v1"

    # --- paths ---------------------------------------------------------------------------

    def path(self, controller: str, sandbox_id: str) -> Path:
        if not sandbox_id or "/" in sandbox_id or sandbox_id in (".", ".."):
            raise RuntimeFailure(f"not a usable sandbox id for a cgroup: {sandbox_id!r}")
        return self.root / controller / self.parent / sandbox_id

    def dirs(self, sandbox_id: str) -> list[Path]:
        """Every cgroup directory of the sandbox, whether it exists or not."""
        names = [*self.controllers, *([UNIFIED] if self._unified else [])]
        return [self.path(name, sandbox_id) for name in names]

    def procs_files(self, sandbox_id: str) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs(sandbox_id)]

    def accounting_files(self, sandbox_id: str) -> list[Path]:
        """The ``cgroup.procs`` a process joins at best (see :func:`join_command`)."""
        if not self.available() or not self._accounting:
            return []
        return [self.path(ACCOUNTING, sandbox_id) / "cgroup.procs"]

    def usage(self, sandbox_id: str) -> CgroupUsage:
        """What the sandbox's cgroups count now; OSError when they are gone."""
        memory = self.path("memory", sandbox_id)
        stat = _stat(memory / "memory.stat")
        used = int((memory / "memory.usage_in_bytes").read_text())
        cache = stat.get("total_cache", stat.get("cache", 0))
        inactive = stat.get("total_inactive_file", stat.get("inactive_file", 0))
        cpu_ns = None
        if self._accounting:
            with contextlib.suppress(OSError, ValueError):
                cpu_ns = int((self.path(ACCOUNTING, sandbox_id) / "cpuacct.usage").read_text())
        return CgroupUsage(cpu_ns, max(0, used - inactive), cache)

    # --- lifecycle -----------------------------------------------------------------------

    def create(self, sandbox_id: str, limits: Limits) -> None:
        """Make the sandbox's cgroups and set its limits (idempotent)."""
        if not self.available():
            raise RuntimeFailure(f"cgroups are unavailable: {self.reason}")
        for d in self.dirs(sandbox_id):
            d.mkdir(exist_ok=True)
        if self._accounting:
            with contextlib.suppress(OSError):  # counting only: never fails a start
                self.path(ACCOUNTING, sandbox_id).mkdir(exist_ok=True)
        memory = self.path("memory", sandbox_id)
        memsw = memory / "memory.memsw.limit_in_bytes"
        if memsw.exists():  # the kernel wants memory <= memory+swap at every step
            _write(memsw, -1)
        _write(memory / "memory.limit_in_bytes", limits.memory_bytes)
        if memsw.exists():  # and no swap beyond the memory limit
            _write(memsw, limits.memory_bytes)
        _write(self.path("pids", sandbox_id) / "pids.max", limits.max_processes)
        if "cpu" in self.controllers:
            cpu = self.path("cpu", sandbox_id)
            period = int((cpu / "cpu.cfs_period_us").read_text())
            _write(cpu / "cpu.cfs_quota_us", limits.cpu_count * period)

    def pids(self, sandbox_id: str) -> set[int]:
        """Every process in any of the sandbox's cgroups."""
        found: set[int] = set()
        for procs in self.procs_files(sandbox_id):
            with contextlib.suppress(FileNotFoundError):
                found.update(int(line) for line in procs.read_text().split())
        return found

    def freeze(self, sandbox_id: str, timeout: float) -> None:
        """Freeze every process of the sandbox; returns once the kernel reports it frozen."""
        if self._unified:
            d = self.path(UNIFIED, sandbox_id)
            _write(d / "cgroup.freeze", 1)
            frozen = procfs.wait_until(timeout, lambda: _events(d).get("frozen") == "1")
        else:
            d = self.path("freezer", sandbox_id)
            _write(d / "freezer.state", "FROZEN")
            frozen = procfs.wait_until(
                timeout, lambda: (d / "freezer.state").read_text().strip() == "FROZEN"
            )
        if not frozen:
            raise RuntimeFailure(f"sandbox {sandbox_id} did not freeze within {timeout:g}s")

    def thaw(self, sandbox_id: str) -> None:
        """Thaw the sandbox; a cgroup that does not exist (any more) is not an error."""
        with contextlib.suppress(FileNotFoundError):
            if self._unified:
                _write(self.path(UNIFIED, sandbox_id) / "cgroup.freeze", 0)
        # Thaw the v1 freezer too: harmless when it was never frozen.
        with contextlib.suppress(FileNotFoundError):
            if "freezer" in self.controllers:
                _write(self.path("freezer", sandbox_id) / "freezer.state", "THAWED")

    def frozen(self, sandbox_id: str) -> bool:
        if self._unified:
            return _events(self.path(UNIFIED, sandbox_id)).get("frozen") == "1"
        state = (self.path("freezer", sandbox_id) / "freezer.state").read_text().strip()
        return state == "FROZEN"

    def kill(self, sandbox_id: str) -> None:
        """SIGKILL every process in the sandbox's cgroups (thaw first, for the v1 freezer)."""
        kill_file = self.path(UNIFIED, sandbox_id) / "cgroup.kill" if self._unified else None
        if kill_file is not None and kill_file.exists():
            _write(kill_file, 1)
        procfs.signal_pids(self.pids(sandbox_id), signal.SIGKILL)

    def remove(self, sandbox_id: str, timeout: float) -> None:
        """Kill what is left, wait until the cgroups are empty, remove them (idempotent)."""
        existing = [d for d in self.dirs(sandbox_id) if d.is_dir()]
        accounting = self.path(ACCOUNTING, sandbox_id)
        if self._accounting and accounting.is_dir():
            existing.append(accounting)
        if not existing:
            return
        self.thaw(sandbox_id)

        def empty() -> bool:
            left = self.pids(sandbox_id)
            procfs.signal_pids(left, signal.SIGKILL)
            return not left

        self.kill(sandbox_id)
        if not procfs.wait_until(timeout, empty):
            raise RuntimeFailure(
                f"sandbox {sandbox_id}: processes {sorted(self.pids(sandbox_id))} survived "
                f"SIGKILL for {timeout:g}s"
            )
        for d in existing:
            if not procfs.wait_until(timeout, functools.partial(_rmdir, d)):
                raise RuntimeFailure(f"cannot remove cgroup {d}: still busy")


def join_command(
    procs_files: Sequence[Path],
    argv: Sequence[str],
    guard: str = "",
    best_effort: Sequence[Path] = (),
) -> list[str]:
    """A command line that puts itself into every given cgroup, then execs ``argv``.

    ``guard`` is an optional shell snippet run first (it should ``exit`` to refuse). The
    command exits 125 without running ``argv`` if any cgroup cannot be joined (e.g. the
    sandbox was destroyed and its cgroups removed); a ``best_effort`` one it may miss.
    """
    if not procs_files and not guard and not best_effort:
        return list(argv)
    steps = [guard] if guard else []
    if procs_files:
        joins = " && ".join(f"echo $$ >{shlex.quote(str(p))}" for p in procs_files)
        steps.append(f"{{ {joins}; }} || exit 125")
    steps += [f"{{ echo $$ >{shlex.quote(str(p))}; }} 2>/dev/null" for p in best_effort]
    script = "; ".join([*steps, 'exec "$@"'])
    return ["/bin/sh", "-c", script, "sandboxctl-join", *argv]


def _write(path: Path, value: object) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)


def _stat(path: Path) -> dict[str, int]:
    pairs = (line.split() for line in path.read_text().splitlines())
    return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].isdigit()}


def _events(d: Path) -> dict[str, str]:
    pairs = (line.split() for line in (d / "cgroup.events").read_text().splitlines())
    return {p[0]: p[1] for p in pairs if len(p) == 2}


def _rmdir(d: Path) -> bool:
    try:
        d.rmdir()
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            return False
        raise
    return True

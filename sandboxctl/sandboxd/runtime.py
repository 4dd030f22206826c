"""The contract between the agent and whatever isolates a sandbox.

The agent decides *which* sandboxes exist (pools, leases, claims, state on disk); a
runtime only starts, finds, freezes, enters and destroys one sandbox at a time. Every
call is synchronous and may block briefly on the kernel; the agent calls it off the
event loop.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sandboxctl.core.errors import SandboxctlError
from sandboxctl.envd.host import Command, Entry


class Size(enum.StrEnum):
    SMALL = "small"
    MEDIUM = "medium"
    LARGE = "large"


@dataclass(frozen=True, slots=True)
class Limits:
    cpu_count: int
    memory_bytes: int
    max_processes: int
    tmp_bytes: int  # /tmp, and /dev/shm as much again
    home_bytes: int  # /home/user
    open_files: int  # per process (RLIMIT_NOFILE); all of them together are memory


# The writable tmpfs (home, /tmp, /dev/shm) are memory: together at most the memory limit,
# so a full home ends in ENOSPC, not in the memory cgroup's OOM killer.
SIZE_LIMITS: Mapping[Size, Limits] = {
    Size.SMALL: Limits(
        cpu_count=1,
        memory_bytes=512 << 20,
        max_processes=256,
        tmp_bytes=64 << 20,
        home_bytes=256 << 20,
        open_files=4096,
    ),
    Size.MEDIUM: Limits(
        cpu_count=2,
        memory_bytes=2 << 30,
        max_processes=512,
        tmp_bytes=256 << 20,
        home_bytes=1 << 30,
        open_files=8192,
    ),
    Size.LARGE: Limits(
        cpu_count=4,
        memory_bytes=8 << 30,
        max_processes=1024,
        tmp_bytes=1 << 30,
        home_bytes=4 << 30,
        open_files=16384,
    ),
}


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """What to start. ``uid`` is a host uid used by no other live sandbox."""

    id: str
    uid: int
    root: Path  # read-only root: "/" for the base template, or a template directory
    home: Path  # host directory bound at /home/user, owned by ``uid``
    limits: Limits
    hostname: str = "sandbox"
    # The sandbox's IPv4 address on its veth ("" without the agent's network): what its
    # /etc/hosts gives its hostname.
    address: str = ""
    # Every sandbox has a network namespace of its own (only ``lo`` until the agent's
    # network gives it a veth); this file, when set, is bound over its /etc/resolv.conf.
    resolv_conf: Path | None = None
    # The claim's env vars, which envd sets for the commands it starts (under each
    # request's own). Runtimes do not read it: a warm sandbox starts before its claim.
    env: Mapping[str, str] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class Identity:
    """Enough to find a sandbox again after the agent restarts, and never mistake a
    recycled pid for it: the pid of the sandbox's init, that process's start time in
    clock ticks since boot, and the inode of its pid namespace."""

    pid: int
    start_time: int
    pid_namespace: int


class RuntimeFailure(SandboxctlError):
    """A runtime could not do what was asked: a start failed, the kernel refused."""


class Runtime(Protocol):
    name: str
    isolated: bool  # False only for the explicit unsafe-process runtime

    @property
    def limits_mode(self) -> str:
        """How limits are enforced here: "cgroup-v1" or "rlimit"."""
        ...

    def start(self, spec: SandboxSpec) -> Identity:
        """Start the sandbox and return once its init runs; it must survive the agent."""
        ...

    def alive(self, identity: Identity) -> bool:
        """True iff this exact sandbox still runs (a recycled pid is not it)."""
        ...

    def freeze(self, spec: SandboxSpec, identity: Identity) -> None:
        """Stop every process of the sandbox until ``thaw``."""
        ...

    def thaw(self, spec: SandboxSpec, identity: Identity) -> None: ...

    def destroy(self, spec: SandboxSpec, identity: Identity | None) -> None:
        """Kill every process, release kernel objects; idempotent, also for a dead one."""
        ...

    def enter(self, spec: SandboxSpec, identity: Identity, command: Command) -> Entry:
        """How the host starts ``command`` inside the sandbox: its namespaces, its uid,
        its limits. The entry's command line and environment carry nothing of
        ``command`` (see ``entering``); the caller spawns and owns the process and
        writes the entry's script to its stdin first. BadCommand for a command that
        cannot be passed on."""
        ...

    def host_path(self, spec: SandboxSpec, identity: Identity, path: str) -> Path:
        """Where an absolute path inside the sandbox is on the host (for file access)."""
        ...

"""The kernel's host-wide tables, sized so that no sandbox can empty one for the others.

Each sandbox is bounded on its own: its memory cgroup is charged for the kernel objects
it makes (about 230 bytes a file, 65 bytes an AIO event, 3 KiB a pty), its pids cgroup
counts its processes, its devpts instance holds at most ``PTYS_PER_SANDBOX`` ptys (set by
the runtime), and the filter lets it track at most ``CONNECTIONS_PER_SANDBOX``
connections (``network/firewall.py``). But some tables have a count of their own for the
whole host, and the kernel's defaults are smaller than what sandboxes' bounds add up to:
two sandboxes of 512 MiB each could hold every slot of a 2.4 million ``fs.file-max``, and
one ``io_setup`` can take all of ``fs.aio-max-nr``. So at start the agent raises each
table (never lowers one) to what ``max_sandboxes`` sandboxes of the largest size could
hold at their bounds, plus a reserve for the host's own processes. A table it cannot
raise (not root, a read-only /proc/sys) is logged with the value to set.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from sandboxctl.envd.process import MAX_TERMINALS
from sandboxctl.sandboxd.runtime import SIZE_LIMITS

log = logging.getLogger("sandboxctl.sandboxd")

SYSCTL: Final = Path("/proc/sys")
# The kernel's smallest charge per object to a sandbox's memory: the most a sandbox at
# its memory limit could hold of each (measured on 6.x: 226 bytes a file, 65 an event).
FILE_BYTES: Final = 192
AIO_EVENT_BYTES: Final = 32
PTYS_PER_SANDBOX: Final = 256  # inside the sandbox (its devpts instance's max)
TERMINALS_PER_SANDBOX: Final = MAX_TERMINALS  # envd's for it, of the host's devpts
CONNECTIONS_PER_SANDBOX: Final = 4096  # tracked connections (conntrack) through the host
PTY_MAX: Final = 1 << 20  # the kernel refuses more
PID_MAX: Final = 1 << 22


@dataclass(frozen=True, slots=True)
class Table:
    """A sysctl, what the host keeps for itself, and what one sandbox may hold at most."""

    name: str  # as sysctl names it
    reserve: int
    per_sandbox: int
    ceiling: int | None = None  # the kernel's own maximum, if any

    def need(self, sandboxes: int) -> int:
        wanted = self.reserve + sandboxes * self.per_sandbox
        return wanted if self.ceiling is None else min(wanted, self.ceiling)

    def path(self, root: Path = SYSCTL) -> Path:
        return root / self.name.replace(".", "/")


def tables(memory_charged: bool = True) -> list[Table]:
    """The tables to size. ``memory_charged``: each sandbox has a memory cgroup, which
    bounds its files and AIO events; without one (rlimit mode) its files are bounded by
    its processes' RLIMIT_NOFILE only, and nothing bounds its AIO events (left alone)."""
    largest = max(SIZE_LIMITS.values(), key=lambda limits: limits.memory_bytes)
    processes = max(limits.max_processes for limits in SIZE_LIMITS.values())
    files = max(limits.open_files * limits.max_processes for limits in SIZE_LIMITS.values())
    sized = [
        # Ptys of other devpts instances stop pty.reserve short of pty.max: that many
        # stay the host's. The agent's terminals for envd come from the host's instance.
        Table("kernel.pty.max", 4096, PTYS_PER_SANDBOX + TERMINALS_PER_SANDBOX, PTY_MAX),
        Table("kernel.pid_max", 1 << 15, processes, PID_MAX),
        Table("kernel.threads-max", 1 << 15, processes),
        Table("net.netfilter.nf_conntrack_max", 1 << 16, CONNECTIONS_PER_SANDBOX),
    ]
    if not memory_charged:
        return [Table("fs.file-max", 1 << 20, files), *sized]
    return [
        Table("fs.file-max", 1 << 20, largest.memory_bytes // FILE_BYTES),
        Table("fs.aio-max-nr", 1 << 16, largest.memory_bytes // AIO_EVENT_BYTES),
        *sized,
    ]


def raise_tables(
    sandboxes: int, chosen: Iterable[Table] | None = None, root: Path = SYSCTL
) -> dict[str, int]:
    """Raise every table below what ``sandboxes`` sandboxes need; what was raised
    (name -> new value). A table the kernel does not have (conntrack not loaded) is
    skipped: it starts at its default when it loads, which the next start raises."""
    raised: dict[str, int] = {}
    for table in tables() if chosen is None else chosen:
        need = table.need(sandboxes)
        path = table.path(root)
        try:
            current = int(path.read_text().split()[0])
        except FileNotFoundError:
            continue
        except (OSError, ValueError, IndexError) as error:
            log.warning("cannot read %s (%s): sandboxes may exhaust it", table.name, error)
            continue
        if current >= need:
            continue
        try:
            path.write_text(str(need))
        except OSError as error:
            log.warning(
                "%s is %d, below the %d that %d sandboxes can hold (%s): one tenant could "
                "exhaust it for the others; set it: sysctl -w %s=%d",
                table.name,
                current,
                need,
                sandboxes,
                error.strerror or error,
                table.name,
                need,
            )
            continue
        log.info("raised %s from %d to %d for %d sandboxes", table.name, current, need, sandboxes)
        raised[table.name] = need
    return raised

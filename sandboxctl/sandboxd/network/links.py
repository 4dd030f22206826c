"""The veth pair of a sandbox, made with iproute2's ``ip``.

Why ``ip`` and not pyroute2: measured on the development machine, a sandbox's whole
link setup took 20 ms with ``ip`` (one batch on the host, one inside the sandbox's
namespace through nsenter) and 28 ms with pyroute2 0.9.7, whose synchronous API runs an
asyncio loop per socket and reaches another namespace through a forked helper; ``ip`` is
on every host already and its commands are what an operator types to debug.

A pair is made with its sandbox end already inside the sandbox's network namespace
(``peer ... netns PID``), so the kernel deletes the pair with that namespace: a sandbox
that dies, even while the agent is down, leaves no veth behind. The host end carries an
alias naming the agent (``sandboxctl:KEY``) so that a start finds its own leftovers and
never another agent's.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from pathlib import Path

from sandboxctl.sandboxd.runtime import RuntimeFailure

PREFIX = "sbx"  # host ends: sbx + the 12 hex digits of the sandbox id (15 bytes, IFNAMSIZ)
INSIDE = "eth0"
TIMEOUT = 10.0


def host_end(sandbox_id: str) -> str:
    """The host end's name: ``sb_c978c6cc4ba6`` -> ``sbxc978c6cc4ba6``."""
    return PREFIX + sandbox_id.removeprefix("sb_")[-12:]


def owner_alias(key: str) -> str:
    return f"sandboxctl:{key}"


class Links:
    def __init__(self) -> None:
        ip, nsenter = shutil.which("ip"), shutil.which("nsenter")
        if ip is None or nsenter is None:
            raise RuntimeFailure("ip and nsenter not found: apt-get install iproute2 util-linux")
        self._ip = ip
        self._nsenter = nsenter

    def attach(self, pid: int, veth: str, address: str, gateway: str, alias: str) -> None:
        """Make the pair for the sandbox whose init is ``pid`` (or repair it): the host
        end up with the gateway address and a route to ``address``; the sandbox end
        ``eth0`` with ``address``, routing everything through the gateway."""
        if not self.exists(veth):
            self._ip_batch(
                [f"link add {veth} type veth peer name {INSIDE} netns {pid}"], force=False
            )
        _disable_ipv6(veth)
        self._ip_batch(
            [
                f"link set dev {veth} alias {alias}",
                f"addr replace {gateway}/32 dev {veth} scope link",
                f"link set dev {veth} up",
                f"route replace {address}/32 dev {veth} scope link src {gateway}",
            ]
        )
        self._ip_batch(
            [
                f"addr replace {address}/32 dev {INSIDE}",
                f"link set dev {INSIDE} up",
                f"route replace {gateway}/32 dev {INSIDE} scope link",
                f"route replace default via {gateway} dev {INSIDE} src {address}",
            ],
            netns_of=pid,
        )

    def exists(self, veth: str) -> bool:
        return Path("/sys/class/net", veth).exists()

    def detach(self, veth: str) -> None:
        """Delete the pair if it is still there (it goes with the sandbox's namespace)."""
        if self.exists(veth):
            result = self._run([self._ip, "link", "del", "dev", veth])
            if result.returncode != 0 and self.exists(veth):
                raise RuntimeFailure(f"cannot delete {veth}: {result.stderr.strip()}")

    def owned(self, alias: str) -> list[str]:
        """Host ends that carry ``alias``: this agent's, alive or left over."""
        return [name for name, found in self._host_ends() if found == alias]

    def aliases(self) -> set[str]:
        """The aliases of every sandbox host end: the agents that have sandboxes here."""
        return {alias for _, alias in self._host_ends()}

    def _host_ends(self) -> list[tuple[str, str]]:
        result = self._run([self._ip, "-j", "-d", "link", "show", "type", "veth"])
        if result.returncode != 0:
            raise RuntimeFailure(f"ip link show failed: {result.stderr.strip()}")
        return [
            (str(link["ifname"]), str(link.get("ifalias", "")))
            for link in json.loads(result.stdout or "[]")
            if str(link.get("ifname", "")).startswith(PREFIX)
        ]

    def _ip_batch(self, lines: list[str], netns_of: int | None = None, force: bool = True) -> None:
        command = [self._ip, *(["-force"] if force else []), "-batch", "-"]
        if netns_of is not None:
            command = [self._nsenter, f"--net=/proc/{netns_of}/ns/net", "--", *command]
        result = self._run(command, "\n".join(lines) + "\n")
        if result.returncode != 0:
            raise RuntimeFailure(f"ip failed: {result.stderr.strip() or result.returncode}")

    def _run(
        self, command: list[str], stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                command, input=stdin, capture_output=True, text=True, timeout=TIMEOUT, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise RuntimeFailure(f"{command[0]} failed: {error}") from None


def _disable_ipv6(veth: str) -> None:
    """Sandboxes get IPv4 only; without this the host end would answer on its fe80::
    address (the filter drops IPv6 from sandboxes too)."""
    with contextlib.suppress(FileNotFoundError):  # a host without IPv6
        Path(f"/proc/sys/net/ipv6/conf/{veth}/disable_ipv6").write_text("1\n")

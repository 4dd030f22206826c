"""``--kit external --config lanes.yaml``: the :class:`~sandboxctl.lanes.kit.Kit` over an
operator's deployment, as its file (:mod:`sandboxctl.lanes.kitfile`) describes it: faults
and facts are the operator's shell commands, templated with the host (or replica) they act
on; the lanes read only through the file's endpoints.
"""

from __future__ import annotations

import shlex
import ssl
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from sandboxctl.agentapi import AgentClient
from sandboxctl.lanes.kit import Host, Replica
from sandboxctl.lanes.kitfile import PLACEHOLDER, ExternalConfig, lacking, load
from sandboxctl.lanes.model import EXTERNAL, KitDown, Lane, LaneError, Progress
from sandboxctl.lanes.observe import (
    POOL_FILL_SECONDS,
    heal_bound,
    healthy,
    pool_full,
    try_inventory,
)

CLIENT_TIMEOUT = 15.0
OUTPUT_TAIL = 300  # characters of a failed command's stderr quoted in its error


class ExternalKit:
    """The Kit protocol over the operator's deployment (see :func:`external_kit`)."""

    def __init__(self, config: ExternalConfig) -> None:
        self.config = config
        self.name = EXTERNAL  # the report's kit; the file's name is the deployment's
        self.windows = config.windows
        self.a = config.a
        self.b = config.b
        self.replicas = config.replicas
        self.proxy_url = config.proxy_url
        self.domain = config.domain
        self.kubeconfig = config.kubeconfig
        self.warm_pool = config.warm_pool
        self.template = config.template
        self.control_plane_name = ""  # the operator's: the file does not say which
        files = config.credentials
        self._e2b_key = _secret(files.e2b_key)
        self._kube_token = _secret(files.kube_token)
        self._agent_token = _secret(files.agent_token)
        self._verify: ssl.SSLContext | bool = _tls(files.ca_bundle)
        # What this kit broke and heal() must restore: "control-plane", "<label>:host",
        # "<label>:publisher".
        self._broken: set[str] = set()

    # --- clients -------------------------------------------------------------------------

    def e2b(self, replica: Replica) -> httpx.Client:
        return httpx.Client(base_url=replica.e2b_url, headers={"X-API-Key": self._e2b_key},
                            verify=self._verify, timeout=CLIENT_TIMEOUT)  # fmt: skip

    def kube(self, replica: Replica) -> httpx.Client:
        return httpx.Client(base_url=replica.kube_url,
                            headers={"Authorization": f"Bearer {self._kube_token}"},
                            verify=self._verify, timeout=CLIENT_TIMEOUT)  # fmt: skip

    def proxy(self) -> httpx.Client:
        return httpx.Client(base_url=self.proxy_url, verify=self._verify, timeout=CLIENT_TIMEOUT)

    def agent(self, host: Host) -> AgentClient:
        return AgentClient(host.agent_url, self._agent_token, timeout=CLIENT_TIMEOUT,
                           transport=httpx.HTTPTransport(verify=self._verify))  # fmt: skip

    # --- faults --------------------------------------------------------------------------

    def kill_host(self, host: Host) -> None:
        self._broken.add(f"{host.label}:host")
        self.run("kill_host", _host_values(host))

    def start_host(self, host: Host) -> None:
        self.run("start_host", _host_values(host))
        self._broken.discard(f"{host.label}:host")

    def stop_publisher(self, host: Host) -> None:
        self._broken.add(f"{host.label}:publisher")
        self.run("stop_publisher", _host_values(host))

    def start_publisher(self, host: Host, stamp: bool = True) -> None:
        if not stamp:
            self._broken.add(f"{host.label}:publisher")
            self.run("start_publisher_unstamped", _host_values(host))
            return
        self.run("start_publisher", _host_values(host))
        self._broken.discard(f"{host.label}:publisher")

    def stop_control_plane(self) -> None:
        self._broken.add("control-plane")
        self.run("stop_control_plane", {})

    def start_control_plane(self) -> None:
        self.run("start_control_plane", {})
        self._broken.discard("control-plane")

    # --- facts ---------------------------------------------------------------------------

    def packets_to_agent(self, host: Host) -> int:
        printed = self.run("packets_to_agent", _host_values(host)).split()
        if not printed or not printed[-1].isdigit():
            said = " ".join(printed)[-80:]
            raise LaneError(f"commands.packets_to_agent printed {said!r}, not a count")
        return int(printed[-1])

    def replica_log(self, replica: Replica) -> str:
        values = {"replica": replica.name, "kube_url": replica.kube_url, "e2b_url": replica.e2b_url}
        return self.run("replica_log", values)

    # --- lifecycle -----------------------------------------------------------------------

    def heal(self, progress: Progress) -> None:
        """Run ``commands.heal`` if given, restore what this kit broke, then wait until
        every replica and both agents answer and both hosts have a NodeInventory (and the
        warm pool holds ``warm_pool_size``, when given)."""
        if self.config.commands.get("heal"):
            self.run("heal", {})
        self.restore()
        progress.wait_for(
            "every replica, both agents and both inventories",
            self._up,
            heal_bound(self.windows),
        )
        if size := self.config.warm_pool_size:
            progress.wait_for(
                f"the warm pool to hold {size}",
                lambda: pool_full(self, size),
                POOL_FILL_SECONDS,
            )

    def restore(self) -> None:
        """Start again what this kit stopped (with the operator's start commands)."""
        if "control-plane" in self._broken:
            self.start_control_plane()
        for host in (self.a, self.b):
            if f"{host.label}:host" in self._broken:
                self.start_host(host)
            if f"{host.label}:publisher" in self._broken:
                self.start_publisher(host)

    def _up(self) -> bool:
        if not all(healthy(self, replica) for replica in self.replicas):
            return False
        hosts = (self.a, self.b)
        return all(try_inventory(self, h) is not None and self._answers(h) for h in hosts)

    def _answers(self, host: Host) -> bool:
        try:
            with self.agent(host) as agent:
                agent.info()
        except Exception:
            return False
        return True

    def describe(self) -> str:
        c = self.config
        lines = [f"external kit {c.name} from {c.path}"]
        lines += [f"  host {h.label}: node {h.node}, agent {h.agent_url}" for h in (self.a, self.b)]
        lines += [f"  {r.name}: Sandbox API {r.kube_url}, e2b {r.e2b_url}" for r in self.replicas]
        lines += [
            f"  envd proxy: {self.proxy_url} (domain {self.domain}); kubeconfig {self.kubeconfig}",
            f"  windows: publish {self.windows.publish:g} s, "
            f"stale after {self.windows.stale_after:g} s",
        ]
        return "\n".join(lines)

    # --- the operator's commands ---------------------------------------------------------

    def run(self, operation: str, values: Mapping[str, str]) -> str:
        """Run the operation's command with its placeholders filled (shell-quoted), in the
        file's directory; its stdout. A missing command, a failure or a timeout is one
        line (LaneError)."""
        template = self.config.commands.get(operation)
        if not template:
            raise LaneError(f"--config {self.config.path} lacks commands.{operation}")
        command = PLACEHOLDER.sub(
            lambda m: shlex.quote(values.get(m.group(1), m.group(0))), template
        )
        timeout = self.config.command_timeout
        try:
            done = subprocess.run(
                ["/bin/sh", "-c", command],
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
                cwd=self.config.path.resolve().parent,  # relative names as in the file
            )
        except subprocess.TimeoutExpired:
            raise LaneError(
                f"commands.{operation} did not end within {timeout:g} s: {command}"
            ) from None
        if done.returncode != 0:
            said = " | ".join(done.stderr.strip().splitlines())[-OUTPUT_TAIL:]
            raise LaneError(f"commands.{operation} exited {done.returncode}: {command}: {said}")
        return done.stdout


def _host_values(host: Host) -> dict[str, str]:
    return {"label": host.label, "node": host.node, "agent_url": host.agent_url}


def _secret(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as error:
        raise LaneError(f"{path}: {error.strerror or error}") from None


@contextmanager
def external_kit(
    config: Path | None, lanes: Sequence[Lane], progress: Progress
) -> Iterator[ExternalKit]:
    """The operator's deployment as a kit: the file is read and checked against ``lanes``'
    needs before anything runs; the kit is healed on entry (so the first lane starts from
    a fleet that answers), and on exit what a lane broke is restored."""
    if config is None:
        raise LaneError("--kit external needs --config FILE (see docs/lanes.md)")
    loaded = load(config)
    missing = lacking(loaded, lanes)
    if missing:
        raise LaneError(f"--config {config} lacks {', '.join(missing)} for the selected lanes")
    kit = ExternalKit(loaded)
    progress.note(f"external kit {loaded.name}: windows publish {kit.windows.publish:g} s, "
                  f"stale after {kit.windows.stale_after:g} s")  # fmt: skip
    try:
        kit.heal(progress)
    except LaneError as error:
        raise KitDown(f"the fleet did not answer before the first lane: {error}") from error
    try:
        yield kit
    finally:
        kit.restore()


def _tls(ca_bundle: Path | None) -> ssl.SSLContext | bool:
    """What the kit's clients verify servers with: the file's CA bundle, else the system's."""
    if ca_bundle is None:
        return True
    try:
        return ssl.create_default_context(cafile=str(ca_bundle))
    except (ssl.SSLError, OSError) as error:
        raise LaneError(f"credentials.ca_bundle: {ca_bundle}: {error}") from None

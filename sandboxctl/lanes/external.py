"""``--kit external --config lanes.yaml``: the :class:`~sandboxctl.lanes.kit.Kit` over an
operator's deployment. The file names the endpoints to watch, the credentials' files, the
windows the fleet runs with, and one shell command per fault or fact a lane needs,
templated with the host (or replica) it acts on. docs/lanes.md#the-external-kit has the
format and an example; :func:`load` refuses a file that lacks what the selected lanes need
in one line naming every missing key.
"""

from __future__ import annotations

import re
import shlex
import ssl
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from sandboxctl.agentapi import AgentClient
from sandboxctl.core.durations import parse_duration
from sandboxctl.core.errors import SandboxctlError
from sandboxctl.lanes.kit import Host, Replica
from sandboxctl.lanes.model import EXTERNAL, KitDown, Lane, LaneError, Progress, Windows
from sandboxctl.lanes.observe import (
    POOL_FILL_SECONDS,
    heal_bound,
    healthy,
    pool_full,
    try_inventory,
)

CLIENT_TIMEOUT = 15.0
DEFAULT_COMMAND_TIMEOUT = 120.0
OUTPUT_TAIL = 300  # characters of a failed command's stderr quoted in its error

# Each command and the placeholders it may use (every value is shell-quoted).
HOST_FIELDS = ("label", "node", "agent_url")
REPLICA_FIELDS = ("replica", "kube_url", "e2b_url")
COMMANDS: dict[str, tuple[str, ...]] = {
    "kill_host": HOST_FIELDS,  # kill -9 the host's agent and publisher
    "start_host": HOST_FIELDS,  # start both again (the agent adopts what it kept)
    "stop_publisher": HOST_FIELDS,  # SIGTERM the publisher only
    "start_publisher": HOST_FIELDS,  # (re)start it stamping publishedAt
    "start_publisher_unstamped": HOST_FIELDS,  # (re)start it as `publish --no-stamp`
    "stop_control_plane": (),
    "start_control_plane": (),
    "packets_to_agent": HOST_FIELDS,  # print one integer: packets toward the agent so far
    "replica_log": REPLICA_FIELDS,  # print everything the replica logged so far
    "heal": (),  # optional: run first whenever the kit heals
}
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class Credentials:
    """Files holding one secret each (whitespace around it ignored), and a CA bundle that
    every client verifies TLS with (None: the system's)."""

    e2b_key: Path
    kube_token: Path
    agent_token: Path
    ca_bundle: Path | None = None


@dataclass(frozen=True)
class ExternalConfig:
    path: Path
    name: str
    windows: Windows
    a: Host
    b: Host
    replicas: tuple[Replica, ...]
    proxy_url: str
    domain: str
    kubeconfig: Path
    warm_pool: str
    template: str
    credentials: Credentials
    commands: Mapping[str, str] = field(default_factory=dict)
    command_timeout: float = DEFAULT_COMMAND_TIMEOUT
    warm_pool_size: int = 0  # heal waits for this many warm sandboxes (0: does not wait)


class _Reader:
    """Reads the file's mapping, collecting every missing or malformed key, so that one
    line names them all."""

    def __init__(self) -> None:
        self.missing: list[str] = []
        self.invalid: list[str] = []

    def section(self, data: Any, key: str, where: str = "") -> dict[str, Any]:
        value = data.get(key) if isinstance(data, dict) else None
        if value is None:
            self.missing.append(where + key)
            return {}
        if not isinstance(value, dict):
            self.invalid.append(f"{where}{key}: expected a mapping")
            return {}
        return value

    def text(
        self, data: dict[str, Any], key: str, where: str = "", default: str | None = None
    ) -> str:
        value = data.get(key, default)
        if value is None or value == "":
            self.missing.append(where + key)
            return ""
        if not isinstance(value, str | int | float):
            self.invalid.append(f"{where}{key}: expected a string")
            return ""
        return str(value)

    def seconds(
        self, data: dict[str, Any], key: str, where: str = "", default: object = None
    ) -> float:
        raw = data.get(key, default)
        if raw is None:
            self.missing.append(where + key)
            return 0.0
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            return float(raw)
        try:
            return parse_duration(str(raw)).total_seconds()
        except SandboxctlError:
            self.invalid.append(f"{where}{key}: {raw!r} is not a duration (e.g. 30s, 1m30s)")
            return 0.0

    def file(
        self, data: dict[str, Any], key: str, base: Path, where: str = "", optional: bool = False
    ) -> Path | None:
        raw = data.get(key)
        if raw is None or raw == "":
            if not optional:
                self.missing.append(where + key)
            return None
        path = Path(str(raw).strip()).expanduser()
        path = path if path.is_absolute() else base / path
        if not path.is_file():
            self.invalid.append(f"{where}{key}: {path}: no such file")
        return path

    def host(self, data: dict[str, Any], label: str) -> Host:
        where = f"hosts.{label.lower()}."
        section = self.section(data, label.lower(), "hosts.")
        node = self.text(section, "node", where)
        return Host(label, node, self.text(section, "agent_url", where))


def load(path: Path) -> ExternalConfig:
    """The file as an :class:`ExternalConfig`; one line naming every key it lacks or gets
    wrong (:class:`LaneError`). Relative file names are read from the file's directory."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise LaneError(f"--config {path}: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(error, "problem", None) or "not YAML"
        raise LaneError(f"--config {path}: {problem}{where}") from None
    if not isinstance(data, dict):
        raise LaneError(f"--config {path}: expected a mapping of settings (see docs/lanes.md)")
    read = _Reader()
    base = path.resolve().parent
    windows = read.section(data, "windows")
    hosts = read.section(data, "hosts")
    credentials = read.section(data, "credentials")
    replicas = data.get("replicas")
    if not replicas:
        read.missing.append("replicas")
        replicas = []
    elif not isinstance(replicas, list):
        read.invalid.append("replicas: expected a list")
        replicas = []
    parsed_replicas = []
    for index, item in enumerate(replicas):
        where = f"replicas[{index}]."
        item = item if isinstance(item, dict) else {}
        parsed_replicas.append(
            Replica(
                read.text(item, "name", where, default=f"r{index + 1}"),
                read.text(item, "kube_url", where),
                read.text(item, "e2b_url", where),
            )
        )
    commands = data.get("commands") or {}
    if not isinstance(commands, dict):
        read.invalid.append("commands: expected a mapping of operation: shell command")
        commands = {}
    for name, command in commands.items():
        if name not in COMMANDS:
            known = ", ".join(COMMANDS)
            read.invalid.append(f"commands.{name}: no such operation (known: {known})")
        elif not isinstance(command, str) or not command.strip():
            read.invalid.append(f"commands.{name}: expected a shell command")
        else:
            unknown = sorted(set(PLACEHOLDER.findall(command)) - set(COMMANDS[name]))
            if unknown:
                known = " ".join("{" + f + "}" for f in COMMANDS[name]) or "none"
                read.invalid.append(
                    f"commands.{name}: unknown placeholder {{{unknown[0]}}} (known: {known})"
                )
    size = data.get("warm_pool_size", 0)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        read.invalid.append("warm_pool_size: expected a count")
        size = 0
    config = ExternalConfig(
        path=path,
        name=str(data.get("name") or EXTERNAL),
        windows=Windows(
            publish=read.seconds(windows, "publish", "windows."),
            stale_after=read.seconds(windows, "stale_after", "windows."),
        ),
        a=read.host(hosts, "A"),
        b=read.host(hosts, "B"),
        replicas=tuple(parsed_replicas),
        proxy_url=read.text(data, "proxy_url"),
        domain=read.text(data, "domain"),
        kubeconfig=read.file(data, "kubeconfig", base) or Path(),
        warm_pool=read.text(data, "warm_pool"),
        template=read.text(data, "template", default="base"),
        credentials=Credentials(
            e2b_key=read.file(credentials, "e2b_key", base, "credentials.") or Path(),
            kube_token=read.file(credentials, "kube_token", base, "credentials.") or Path(),
            agent_token=read.file(credentials, "agent_token", base, "credentials.") or Path(),
            ca_bundle=read.file(credentials, "ca_bundle", base, "credentials.", optional=True),
        ),
        commands={name: command for name, command in commands.items() if isinstance(command, str)},
        command_timeout=read.seconds(data, "command_timeout", default=DEFAULT_COMMAND_TIMEOUT),
        warm_pool_size=size,
    )
    if read.missing:
        raise LaneError(f"--config {path} lacks {', '.join(read.missing)}")
    if read.invalid:
        raise LaneError(f"--config {path}: {'; '.join(read.invalid)}")
    w = config.windows
    if not 0 < w.publish < w.stale_after:
        raise LaneError(
            f"--config {path}: windows.stale_after ({w.stale_after:g} s) must be above "
            f"windows.publish ({w.publish:g} s), both above 0"
        )
    return config


def lacking(config: ExternalConfig, lanes: Sequence[Lane]) -> list[str]:
    """The commands the selected lanes need that the file does not give, each with the
    lanes that need it: ``commands.kill_host (K1A-03, K1A-04)``."""
    needed: dict[str, list[str]] = {}
    for lane in lanes:
        for need in sorted(lane.needs):
            needed.setdefault(need, []).append(lane.id)
    return [
        f"commands.{need} ({', '.join(ids)})"
        for need, ids in needed.items()
        if not config.commands.get(need)
    ]


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

"""The external kit's file (``--kit external --config lanes.yaml``): endpoints, credentials'
files, the fleet's windows and one shell command per fault or fact, with the host (or
replica) it acts on as placeholders. docs/lanes.md#the-external-kit has the format and
an example.

The YAML is decoded into a typed model (msgspec) whose keys are all optional, so that
:func:`load` can then name every key the file lacks in one line; a value of the wrong
shape is refused by the decoding, naming its key. Relative file names are read from the
file's directory.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec
import yaml

from sandboxctl.core.durations import parse_duration
from sandboxctl.core.errors import SandboxctlError
from sandboxctl.lanes.kit import Host, Replica
from sandboxctl.lanes.model import EXTERNAL, Lane, LaneError, Windows

DEFAULT_COMMAND_TIMEOUT = 120.0

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


# --- the file as written ------------------------------------------------------------------

Text = str | int | float | bool  # a value written bare (a port, a node 1) is read as its text
Duration = str | int | float  # a Go duration (30s, 1m30s) or seconds


class _WindowsFile(msgspec.Struct):
    publish: Duration | None = None
    stale_after: Duration | None = None


class _HostFile(msgspec.Struct):
    node: Text | None = None
    agent_url: Text | None = None


class _HostsFile(msgspec.Struct):
    a: _HostFile | None = None
    b: _HostFile | None = None


class _ReplicaFile(msgspec.Struct):
    name: Text | None = None
    kube_url: Text | None = None
    e2b_url: Text | None = None


class _CredentialsFile(msgspec.Struct):
    e2b_key: Text | None = None
    kube_token: Text | None = None
    agent_token: Text | None = None
    ca_bundle: Text | None = None


class _KitFile(msgspec.Struct):
    """The file as written; keys the kit does not read are ignored."""

    name: Text | None = None
    windows: _WindowsFile | None = None
    hosts: _HostsFile | None = None
    replicas: list[_ReplicaFile] | None = None
    proxy_url: Text | None = None
    domain: Text | None = None
    kubeconfig: Text | None = None
    warm_pool: Text | None = None
    warm_pool_size: Annotated[int, msgspec.Meta(ge=0)] = 0
    template: Text | None = None
    credentials: _CredentialsFile | None = None
    command_timeout: Duration | None = None
    commands: dict[str, Any] | None = None  # checked by _commands, naming each operation


# --- reading it ---------------------------------------------------------------------------


def load(path: Path) -> ExternalConfig:
    """The file as an :class:`ExternalConfig`; one line naming every key it lacks or gets
    wrong (:class:`LaneError`)."""
    written = _decode(path, _yaml(path))
    read = _Reader(path.resolve().parent)
    config = _config(path, written, read)
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


def _yaml(path: Path) -> object:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise LaneError(f"--config {path}: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(error, "problem", None) or "not YAML"
        raise LaneError(f"--config {path}: {problem}{where}") from None


def _decode(path: Path, data: object) -> _KitFile:
    if not isinstance(data, dict):
        raise LaneError(f"--config {path}: expected a mapping of settings (see docs/lanes.md)")
    try:
        return msgspec.convert(data, _KitFile)
    except msgspec.ValidationError as error:
        raise LaneError(f"--config {path}: {_shape_problem(error)}") from None


# msgspec's names for the shapes a key may have, as the file's reader knows them.
_SHAPES = {
    "object": "a mapping",
    "array": "a list",
    "str": "a string",
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false",
}
_EXPECTED = re.compile(r"^Expected `([^`]*)`(.*?)(?:, got `([^`]*)`)? - at `\$\.?([^`]*)`$")


def _shape_problem(error: msgspec.ValidationError) -> str:
    """msgspec's ``Expected `array | null`, got `int` - at `$.replicas``` as
    ``replicas: expected a list, got a whole number``."""
    found = _EXPECTED.match(str(error))
    if found is None:
        return str(error)
    expected, condition, got, where = found.groups()
    shapes = [t for t in expected.split(" | ") if t != "null"]
    if "str" in shapes:  # numbers and booleans are read as their text
        shapes = ["str"]
    wanted = " or ".join(_SHAPES.get(t, t) for t in shapes)
    text = f"{where or 'the file'}: expected {wanted}{condition}"
    return f"{text}, got {_SHAPES.get(got, got)}" if got else text


class _Reader:
    """Reads the decoded file's values, collecting every missing or wrong one, so that
    one line names them all."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.missing: list[str] = []
        self.invalid: list[str] = []

    def text(self, value: Text | None, key: str, default: str | None = None) -> str:
        value = default if value is None else value
        if value is None or value == "":
            self.missing.append(key)
            return ""
        return str(value)

    def seconds(self, value: Duration | None, key: str, default: float | None = None) -> float:
        if value is None:
            if default is None:
                self.missing.append(key)
            return default or 0.0
        if isinstance(value, int | float):
            return float(value)
        try:
            return parse_duration(value).total_seconds()
        except SandboxctlError:
            self.invalid.append(f"{key}: {value!r} is not a duration (e.g. 30s, 1m30s)")
            return 0.0

    def file(self, value: Text | None, key: str) -> Path:
        found = self.optional_file(value, key)
        if found is None:
            self.missing.append(key)
            return Path()
        return found

    def optional_file(self, value: Text | None, key: str) -> Path | None:
        if value is None or value == "":
            return None
        path = Path(str(value).strip()).expanduser()
        path = path if path.is_absolute() else self.base / path
        if not path.is_file():
            self.invalid.append(f"{key}: {path}: no such file")
        return path


def _config(path: Path, written: _KitFile, read: _Reader) -> ExternalConfig:
    windows = written.windows or _WindowsFile()
    hosts = written.hosts or _HostsFile()
    files = written.credentials or _CredentialsFile()
    return ExternalConfig(
        path=path,
        name=str(written.name or EXTERNAL),
        windows=Windows(
            publish=read.seconds(windows.publish, "windows.publish"),
            stale_after=read.seconds(windows.stale_after, "windows.stale_after"),
        ),
        a=_host(read, "A", hosts.a),
        b=_host(read, "B", hosts.b),
        replicas=_replicas(read, written.replicas),
        proxy_url=read.text(written.proxy_url, "proxy_url"),
        domain=read.text(written.domain, "domain"),
        kubeconfig=read.file(written.kubeconfig, "kubeconfig"),
        warm_pool=read.text(written.warm_pool, "warm_pool"),
        template=read.text(written.template, "template", default="base"),
        credentials=Credentials(
            e2b_key=read.file(files.e2b_key, "credentials.e2b_key"),
            kube_token=read.file(files.kube_token, "credentials.kube_token"),
            agent_token=read.file(files.agent_token, "credentials.agent_token"),
            ca_bundle=read.optional_file(files.ca_bundle, "credentials.ca_bundle"),
        ),
        commands=_commands(read, written.commands or {}),
        command_timeout=read.seconds(
            written.command_timeout, "command_timeout", default=DEFAULT_COMMAND_TIMEOUT
        ),
        warm_pool_size=written.warm_pool_size,
    )


def _host(read: _Reader, label: str, written: _HostFile | None) -> Host:
    where = f"hosts.{label.lower()}."
    written = written or _HostFile()
    node = read.text(written.node, where + "node")
    return Host(label, node, read.text(written.agent_url, where + "agent_url"))


def _replicas(read: _Reader, written: list[_ReplicaFile] | None) -> tuple[Replica, ...]:
    if not written:
        read.missing.append("replicas")
        return ()
    return tuple(
        Replica(
            read.text(item.name, f"replicas[{index}].name", default=f"r{index + 1}"),
            read.text(item.kube_url, f"replicas[{index}].kube_url"),
            read.text(item.e2b_url, f"replicas[{index}].e2b_url"),
        )
        for index, item in enumerate(written)
    )


def _commands(read: _Reader, written: Mapping[str, Any]) -> dict[str, str]:
    """The operations' commands: each a known operation, a shell command, and only the
    operation's placeholders (other braces are the shell's)."""
    for name, command in written.items():
        if name not in COMMANDS:
            known = ", ".join(COMMANDS)
            read.invalid.append(f"commands.{name}: no such operation (known: {known})")
        elif not isinstance(command, str) or not command.strip():
            read.invalid.append(f"commands.{name}: expected a shell command")
        elif unknown := sorted(set(PLACEHOLDER.findall(command)) - set(COMMANDS[name])):
            known = " ".join("{" + f + "}" for f in COMMANDS[name]) or "none"
            read.invalid.append(
                f"commands.{name}: unknown placeholder {{{unknown[0]}}} (known: {known})"
            )
    return {name: command for name, command in written.items() if isinstance(command, str)}

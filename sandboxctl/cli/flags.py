"""Flags several verbs share, their parsers, and the one check of the inventory-source
flags, each defined once.

Light on purpose: typer and the pure core only. ``status`` (a verb an operator runs often)
takes its flags from here and so parses them without loading ``cli/options``, which
imports the servers' stack (a quarter of a second of a start)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer

from sandboxctl.core.durations import format_duration, parse_duration
from sandboxctl.core.errors import ConfigurationError, InvalidValueError
from sandboxctl.core.freshness import DEFAULT_STALE_AFTER
from sandboxctl.core.timestamps import parse_rfc3339


def parse_duration_flag(value: str | timedelta) -> timedelta:
    """Typer parser for duration flags; a bad value names the flag via click."""
    if isinstance(value, timedelta):
        return value
    try:
        return parse_duration(value)
    except InvalidValueError as error:
        raise typer.BadParameter(str(error)) from None


def parse_time_flag(value: str | datetime) -> datetime:
    """Typer parser for RFC 3339 flags."""
    if isinstance(value, datetime):
        return value
    try:
        return parse_rfc3339(value)
    except InvalidValueError as error:
        raise typer.BadParameter(str(error)) from None


StaleAfter = Annotated[
    timedelta,
    typer.Option(
        "--inventory-stale-after",
        "--stale-after",
        parser=parse_duration_flag,
        metavar="DURATION",
        help="A node whose publish trails the reference by more than this is stale (a "
        "service drops it).",
        show_default=format_duration(DEFAULT_STALE_AFTER),
    ),
]
Kubeconfig = Annotated[
    Path | None,
    typer.Option(
        "--kubeconfig",
        metavar="FILE",
        help="The Kubernetes API to use. Default: the pod's service account in a pod, "
        "else $KUBECONFIG or ~/.kube/config.",
    ),
]
Seeds = Annotated[
    str,
    typer.Option(
        "--sandboxd-seeds",
        metavar="HOST:PORT,...",
        help="The sandboxd agents to ask (mesh), comma-separated.",
    ),
]
SandboxdTokenFile = Annotated[
    Path | None,
    typer.Option(
        "--sandboxd-token-file",
        help="File holding the fleet's root token for the agents. Without it only "
        "development agents (no token) answer.",
    ),
]


class TableOrJson(enum.StrEnum):
    TABLE = "table"
    JSON = "json"


TableOrJsonOutput = Annotated[
    TableOrJson, typer.Option("--output", "-o", help="table or json.", case_sensitive=False)
]


class Source(enum.StrEnum):
    """Where a verb reads the fleet's inventories; each verb takes some of these."""

    FILE = "file"  # inventory --from
    STATE = "state"  # status: the fleet serve runs over a state dir
    MESH = "mesh"  # the agents themselves
    KUBE = "kube"  # the NodeInventory objects of a Kubernetes API


def parse_source(text: str, choices: Sequence[Source]) -> Source:
    """``--source`` as one of ``choices`` (one line, exit 2 otherwise)."""
    for choice in choices:
        if text.strip().lower() == choice.value:
            return choice
    names = [choice.value for choice in choices]
    expected = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]
    raise InvalidValueError(f"--source {text!r}: expected {expected}")


@dataclass(frozen=True, slots=True)
class SourceFlags:
    """The source flags of a one-shot read, checked to fit together."""

    source: Source
    seeds: tuple[str, ...]
    token_file: Path | None
    kubeconfig: Path | None
    path: str | None


def parse_seeds(text: str) -> tuple[str, ...]:
    """``HOST:PORT,HOST:PORT`` as addresses, once each, in order."""
    return tuple(dict.fromkeys(seed.strip() for seed in text.split(",") if seed.strip()))


# Which sources each flag is for (a verb offers some of them).
_FLAG_SOURCES: dict[str, tuple[Source, ...]] = {
    "--from": (Source.FILE,),
    "--sandboxd-seeds": (Source.MESH, Source.STATE),
    "--sandboxd-token-file": (Source.MESH,),  # serve's state dir holds its own token
    "--kubeconfig": (Source.KUBE,),
}


def check_source_flags(
    source: str,
    choices: Sequence[Source],
    *,
    seeds: str = "",
    token_file: Path | None = None,
    kubeconfig: Path | None = None,
    path: str | None = None,
) -> SourceFlags:
    """The source flags of ``inventory`` and ``status``, refused alike (one line, exit 2)
    when a flag is for another source or mesh has no seed."""
    chosen = parse_source(source, choices)
    addresses = parse_seeds(seeds)
    given = {
        "--from": path is not None,
        "--sandboxd-seeds": bool(addresses),
        "--sandboxd-token-file": token_file is not None,
        "--kubeconfig": kubeconfig is not None,
    }
    for flag, is_given in given.items():
        fits = [s.value for s in _FLAG_SOURCES[flag] if s in choices]
        if is_given and chosen.value not in fits:
            raise ConfigurationError(f"{flag} is for --source {' or '.join(fits)}, not {chosen}")
    if chosen is Source.MESH and not addresses:
        raise ConfigurationError("--source mesh needs --sandboxd-seeds HOST:PORT[,HOST:PORT...]")
    return SourceFlags(chosen, addresses, token_file, kubeconfig, path)

"""The inventory-source flags every fleet service takes, and the source they describe.

``serve-apiserver`` and ``serve-proxy`` read the same fleet the same way, so they share
these definitions: one flag, one meaning, one default everywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer

from sandboxctl.cli.options import parse_duration_flag
from sandboxctl.core.durations import format_duration
from sandboxctl.core.errors import ConfigurationError, InvalidValueError
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.inventory.mesh import DEFAULT_POLL_INTERVAL, MeshInventorySource
from sandboxctl.secretfiles import read_secret
from sandboxctl.store import SandboxStore
from sandboxctl.store.nodes import NodeAccess

SOURCES = ("mesh",)
__all__ = ["DEFAULT_POLL_INTERVAL", "InventoryPoll", "SandboxdTokenFile", "Seeds", "Source"]

Source = Annotated[
    str,
    typer.Option(
        "--source",
        metavar="mesh",
        help="Where inventories come from. mesh: poll the sandboxd agents directly.",
    ),
]
Seeds = Annotated[
    str,
    typer.Option(
        "--sandboxd-seeds",
        metavar="HOST:PORT,...",
        help="The sandboxd agents to poll (mesh), comma-separated.",
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
InventoryPoll = Annotated[
    timedelta,
    typer.Option(
        "--inventory-poll",
        parser=parse_duration_flag,
        metavar="DURATION",
        help="How often mesh mode polls every agent.",
        show_default=format_duration(DEFAULT_POLL_INTERVAL),
    ),
]


@dataclass(frozen=True, slots=True)
class MeshSource:
    """What the flags describe: the (not yet started) source and the fleet token."""

    inventories: MeshInventorySource
    token: str | None
    seeds: tuple[str, ...]

    @contextmanager
    def store(self, rule: FreshnessRule) -> Iterator[SandboxStore]:
        """Start polling (one line and exit 2 when no seed answers or one refuses the
        token), then a store with node access over it; both are stopped on exit."""
        self.inventories.start()
        store = SandboxStore(self.inventories, rule, nodes=NodeAccess(self.token))
        try:
            yield store
        finally:
            self.inventories.stop()
            store.close()


def mesh_source(
    source: str, seeds: str, token_file: Path | None, poll: timedelta, log: logging.Logger
) -> MeshSource:
    """Check the source flags (one line, exit 2 on a mistake) and build the source."""
    if source not in SOURCES:
        raise InvalidValueError(
            f"--source {source!r}: only mesh is supported for now (poll the agents given "
            "by --sandboxd-seeds)"
        )
    addresses = tuple(seed.strip() for seed in seeds.split(",") if seed.strip())
    if not addresses:
        raise ConfigurationError("--source mesh needs --sandboxd-seeds HOST:PORT[,HOST:PORT...]")
    token = read_secret("--sandboxd-token-file", token_file) if token_file else None
    if token is None:
        log.warning("no --sandboxd-token-file: only development agents (no token) will answer")
    return MeshSource(MeshInventorySource(addresses, token, poll_interval=poll), token, addresses)

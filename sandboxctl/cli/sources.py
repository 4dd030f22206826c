"""The inventory-source flags every fleet service takes, and the source they describe.

``serve-apiserver`` and ``serve-proxy`` read the same fleet the same way, so they share
these definitions: one flag, one meaning, one default everywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Protocol

import typer

from sandboxctl.cli.flags import (
    Kubeconfig,
    SandboxdTokenFile,
    Seeds,
    parse_duration_flag,
    parse_seeds,
    parse_source,
)
from sandboxctl.cli.flags import Source as From
from sandboxctl.core.durations import format_duration
from sandboxctl.core.errors import ConfigurationError
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.inventory import InventorySource
from sandboxctl.inventory.mesh import DEFAULT_POLL_INTERVAL, MeshInventorySource
from sandboxctl.secretfiles import read_secret
from sandboxctl.store import SandboxStore
from sandboxctl.store.nodes import NodeAccess

if TYPE_CHECKING:  # the kube source loads the Kubernetes client only when it is chosen
    from kubernetes.client import ApiClient

    from sandboxctl.inventory.kube import KubeInventorySource

SOURCES = (From.MESH, From.KUBE)  # a service reads the agents or the NodeInventory objects
__all__ = [
    "DEFAULT_POLL_INTERVAL",
    "InventoryPoll",
    "Kubeconfig",
    "SandboxdTokenFile",
    "Seeds",
    "Source",
]

Source = Annotated[
    str,
    typer.Option(
        "--source",
        metavar="mesh|kube",
        help="Where inventories come from. mesh: poll the sandboxd agents directly. kube: "
        "watch the NodeInventory objects the hosts publish (--kubeconfig).",
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

    @property
    def description(self) -> str:
        return f"{len(self.seeds)} agents"

    def store(self, rule: FreshnessRule) -> AbstractContextManager[SandboxStore]:
        """Start polling (one line and exit 2 when no seed answers or one refuses the
        token), then a store with node access over it; both are stopped on exit."""
        return _started_store(self.inventories, self.token, rule)


@dataclass(frozen=True, slots=True)
class KubeSource:
    """The kube source (not yet started) and the fleet token for the agents."""

    inventories: KubeInventorySource
    token: str | None
    api: ApiClient
    description: str = "the NodeInventory objects (kube)"

    def store(self, rule: FreshnessRule) -> AbstractContextManager[SandboxStore]:
        """Start the informer and wait for its first list (one line and exit 2 when it
        does not come), then a store with node access over it; both stopped on exit."""
        return _started_store(self.inventories, self.token, rule)


class _Running(InventorySource, Protocol):
    """A source with a lifecycle: mesh polling, the kube informer."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


@contextmanager
def _started_store(
    inventories: _Running, token: str | None, rule: FreshnessRule
) -> Iterator[SandboxStore]:
    inventories.start()
    store = SandboxStore(inventories, rule, nodes=NodeAccess(token))
    try:
        yield store
    finally:
        inventories.stop()
        store.close()


def fleet_source(
    source: str,
    seeds: str,
    token_file: Path | None,
    poll: timedelta,
    kubeconfig: Path | None,
    publish_interval: timedelta,
    log: logging.Logger,
) -> MeshSource | KubeSource:
    """The source the flags name (one line, exit 2 on a mistake), not yet started."""
    if parse_source(source, SOURCES) is not From.KUBE:
        return mesh_source(source, seeds, token_file, poll, log)
    if seeds.strip():
        raise ConfigurationError("--sandboxd-seeds is for --source mesh; kube reads NodeInventory")
    from sandboxctl.inventory.kube import KubeInventorySource
    from sandboxctl.kube import api_client

    token = _fleet_token(token_file, log)
    # Stall credit of one publish interval, as mesh mode has one poll: see inventory/kube.py.
    api = api_client(kubeconfig)
    inventories = KubeInventorySource(api, stall_after=publish_interval)
    return KubeSource(inventories, token, api)


def _fleet_token(token_file: Path | None, log: logging.Logger) -> str | None:
    token = read_secret("--sandboxd-token-file", token_file) if token_file else None
    if token is None:
        log.warning("no --sandboxd-token-file: only development agents (no token) will answer")
    return token


def mesh_source(
    source: str, seeds: str, token_file: Path | None, poll: timedelta, log: logging.Logger
) -> MeshSource:
    """Check the source flags (one line, exit 2 on a mistake) and build the source."""
    parse_source(source, SOURCES)
    addresses = parse_seeds(seeds)
    if not addresses:
        raise ConfigurationError("--source mesh needs --sandboxd-seeds HOST:PORT[,HOST:PORT...]")
    token = _fleet_token(token_file, log)
    return MeshSource(MeshInventorySource(addresses, token, poll_interval=poll), token, addresses)

"""The warm-pool driver's flags on ``serve-apiserver``, and the process manager that runs
it under its Lease."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sandboxctl.cli.options import parse_duration_flag
from sandboxctl.cli.sources import KubeSource, MeshSource
from sandboxctl.core.durations import format_duration
from sandboxctl.core.errors import ConfigurationError
from sandboxctl.core.leases import (
    LEASE_DURATION,
    RENEW_DEADLINE,
    RETRY_PERIOD,
    WARM_POOL_SYNC_INTERVAL,
)
from sandboxctl.lifecycle import Group, Manager
from sandboxctl.store import SandboxStore

if TYPE_CHECKING:  # loaded when used: the Kubernetes client costs every command's start
    from sandboxctl.apiserver.warmpool import DriverSettings


def _duration(flag: str, help_text: str, default: timedelta) -> Any:
    return typer.Option(
        flag,
        parser=parse_duration_flag,
        metavar="DURATION",
        help=help_text,
        show_default=format_duration(default),
    )


WarmPoolDriverFlag = Annotated[
    bool | None,
    typer.Option(
        "--warm-pool-driver/--no-warm-pool-driver",
        help="Spread SandboxWarmPool replicas over the fresh nodes while this replica holds "
        "the driver's Lease. Default: on with --source kube; needs it.",
        show_default=False,
    ),
]
WarmPoolSyncInterval = Annotated[
    timedelta,
    _duration("--warm-pool-sync-interval", "How often the driver syncs.", WARM_POOL_SYNC_INTERVAL),
]
LeaderElectionNamespace = Annotated[
    str,
    typer.Option(
        "--leader-election-namespace",
        metavar="NAMESPACE",
        help="Namespace of the driver's Lease (default: the pod's, else sandbox-system).",
    ),
]
LeaseDuration = Annotated[
    timedelta,
    _duration(
        "--leader-election-lease-duration",
        "How long a silent leader keeps the Lease, as the others see it.",
        LEASE_DURATION,
    ),
]
RenewDeadline = Annotated[
    timedelta,
    _duration(
        "--leader-election-renew-deadline",
        "A leader that could not renew for this long stops its driver (never the server).",
        RENEW_DEADLINE,
    ),
]
RetryPeriod = Annotated[
    timedelta,
    _duration("--leader-election-retry-period", "How often to renew or campaign.", RETRY_PERIOD),
]


def check_warm_pool_driver(
    source: MeshSource | KubeSource, enabled: bool | None, interval: timedelta
) -> None:
    """Refuse driver flags that cannot work (one line, exit 2) before anything starts."""
    if enabled and not isinstance(source, KubeSource):
        raise ConfigurationError("--warm-pool-driver needs --source kube")
    if interval <= timedelta(0):
        raise ConfigurationError("--warm-pool-sync-interval must be positive")


def warm_pool_settings(
    interval: timedelta,
    namespace: str,
    lease_duration: timedelta,
    renew_deadline: timedelta,
    retry_period: timedelta,
) -> DriverSettings:
    """The driver's flags as its settings."""
    from sandboxctl.apiserver.warmpool import DriverSettings

    return DriverSettings(
        interval=interval,
        lease_namespace=namespace,
        lease_duration=lease_duration,
        renew_deadline=renew_deadline,
        retry_period=retry_period,
    )


def warm_pool_manager(
    source: MeshSource | KubeSource,
    store: SandboxStore,
    enabled: bool | None,
    settings: DriverSettings,
    log: logging.Logger,
) -> Manager:
    """The process manager of serve-apiserver: with the driver (``--source kube``, unless
    ``--no-warm-pool-driver``) as its leader-elected part under the driver's Lease."""
    from sandboxctl.apiserver.warmpool import DriverLease, WarmPoolDriver

    check_warm_pool_driver(source, enabled, settings.interval)
    if not isinstance(source, KubeSource) or enabled is False:
        return Manager()
    lease = DriverLease(source.api, settings)
    manager = Manager(election=lease)
    manager.add(WarmPoolDriver(source.api, store, source.token, settings), Group.LEADER_ELECTED)
    log.info(
        "warm-pool driver: campaigning for Lease %s/%s as %s",
        lease.namespace,
        lease.name,
        lease.identity,
    )
    return manager

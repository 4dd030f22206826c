"""The timings of Lease leader election and of the warm-pool driver it runs, written once:
the Kubernetes layer, the driver and the CLI's flags all read these (the CLI without
loading the Kubernetes client, which mesh mode does without)."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

LEASE_DURATION: Final = timedelta(seconds=15)  # how long a silent leader keeps the Lease
RENEW_DEADLINE: Final = timedelta(seconds=10)  # a leader that cannot renew by then stops
RETRY_PERIOD: Final = timedelta(seconds=2)  # how often to renew or campaign
REJOIN_AFTER: Final = timedelta(seconds=5)  # before a stopped leader campaigns again
WARM_POOL_SYNC_INTERVAL: Final = timedelta(seconds=5)  # how often the driver syncs

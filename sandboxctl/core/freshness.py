"""The inventory freshness rule: which nodes a reader still believes.

A node is judged against a *reference* taken from the fleet itself, never against the
reader's clock alone, so a control-plane outage (every stamp freezes together) or a
publisher whose clock runs ahead cannot evict anybody:

    publish mode:      reference = min(newest stamp, now)
    extrapolate mode:  reference = min(newest + min(elapsed since newest was first seen,
                                                    publish_interval), now)

A node is stale when ``reference - stamp > stale_after`` (strictly greater). A node that
never stamps is fresh, and with no reference (nothing stamped yet) everyone is fresh.
A reader that saw no new stamp at all for longer than one publish interval credits that
silence, beyond one interval, to every node stamped before it (``snapshot.Stall``), so the
first publish after an outage does not drop the nodes that have not yet published again.
``now`` is the reader's wall clock and ``monotonic`` its monotonic clock, both passed in.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta

from sandboxctl.core.durations import format_duration
from sandboxctl.core.errors import ConfigurationError

DEFAULT_STALE_AFTER = timedelta(seconds=90)
DEFAULT_PUBLISH_INTERVAL = timedelta(seconds=30)


class ReferenceMode(enum.StrEnum):
    PUBLISH = "publish"
    EXTRAPOLATE = "extrapolate"


class NodeState(enum.StrEnum):
    FRESH = "fresh"
    STALE = "stale"
    UNSTAMPED = "unstamped"
    AHEAD = "ahead"  # stamped later than the reader's clock; kept, age is negative


class ReferenceOrigin(enum.StrEnum):
    NONE = "none"  # no node is stamped: everyone is fresh
    NEWEST_PUBLISH = "newest-publish"
    EXTRAPOLATED = "extrapolated"  # newest publish plus the reader's elapsed time
    CAPPED_BY_NOW = "capped-by-now"  # the newest stamp is ahead of the reader's clock


@dataclass(frozen=True, slots=True)
class Reference:
    at: datetime | None
    origin: ReferenceOrigin
    newest: datetime | None


@dataclass(frozen=True, slots=True)
class FreshnessRule:
    stale_after: timedelta = DEFAULT_STALE_AFTER
    mode: ReferenceMode = ReferenceMode.PUBLISH
    publish_interval: timedelta = DEFAULT_PUBLISH_INTERVAL

    def validate(self, allow_unsafe: bool = False) -> FreshnessRule:
        """Refuse settings that cannot work, and (unless ``allow_unsafe``, as ``simulate``
        needs) settings that would drop live nodes. Returns self for chaining."""
        if self.stale_after <= timedelta(0):
            raise ConfigurationError(
                f"--inventory-stale-after must be positive, got {format_duration(self.stale_after)}"
            )
        if self.publish_interval <= timedelta(0):
            raise ConfigurationError(
                f"--publish-interval must be positive, got {format_duration(self.publish_interval)}"
            )
        unsafe_extrapolation = self.stale_after <= 2 * self.publish_interval
        if self.mode is ReferenceMode.EXTRAPOLATE and unsafe_extrapolation and not allow_unsafe:
            raise ConfigurationError(
                "--inventory-reference extrapolate needs --inventory-stale-after "
                f"({format_duration(self.stale_after)}) above twice --publish-interval "
                f"({format_duration(2 * self.publish_interval)}): during an outage the "
                "reference runs one interval past the last publish, and live nodes trail it "
                "by another"
            )
        return self

    def warnings(self) -> list[str]:
        """Settings that run but are unsafe; each line says what goes wrong."""
        out = []
        if self.stale_after <= self.publish_interval:
            out.append(
                f"stale-after {format_duration(self.stale_after)} is not above the publish "
                f"interval {format_duration(self.publish_interval)}: a live node is dropped "
                "between two of its own publishes"
            )
        if self.mode is ReferenceMode.EXTRAPOLATE and self.stale_after <= 2 * self.publish_interval:
            out.append(
                f"extrapolate needs stale-after above {format_duration(2 * self.publish_interval)}"
                " (twice the publish interval): an outage would drop live nodes"
            )
        return out

    def reference(
        self,
        newest: datetime | None,
        now: datetime,
        newest_seen_at: float | None = None,
        monotonic: float | None = None,
    ) -> Reference:
        """The reference time for one read.

        ``newest_seen_at`` is the reader's monotonic time when it first saw ``newest``; with
        ``monotonic`` (the reader's monotonic clock now) it drives extrapolation.
        """
        if newest is None:
            return Reference(None, ReferenceOrigin.NONE, None)
        at = newest
        origin = ReferenceOrigin.NEWEST_PUBLISH
        if (
            self.mode is ReferenceMode.EXTRAPOLATE
            and newest_seen_at is not None
            and monotonic is not None
        ):
            elapsed = timedelta(seconds=max(0.0, monotonic - newest_seen_at))
            step = min(elapsed, self.publish_interval)
            if step > timedelta(0):
                at = newest + step
                origin = ReferenceOrigin.EXTRAPOLATED
        if at > now:
            return Reference(now, ReferenceOrigin.CAPPED_BY_NOW, newest)
        return Reference(at, origin, newest)

    def cutoff(self, reference: Reference) -> datetime | None:
        """Stamps older than this are stale; None when nothing can be stale."""
        if reference.at is None:
            return None
        return reference.at - self.stale_after

    def is_stale(
        self,
        stamp: datetime | None,
        reference: Reference | None,
        credit: timedelta = timedelta(0),
    ) -> bool:
        """The rule for one node; no stamp or no reference yet means fresh.

        ``credit`` is stall time not held against the node (see ``snapshot.Stall``).
        """
        if stamp is None or reference is None or reference.at is None:
            return False
        return reference.at - stamp - credit > self.stale_after

    def state(
        self,
        stamp: datetime | None,
        reference: Reference,
        now: datetime,
        credit: timedelta = timedelta(0),
    ) -> NodeState:
        if stamp is None:
            return NodeState.UNSTAMPED
        if self.is_stale(stamp, reference, credit):
            return NodeState.STALE
        if stamp > now:
            return NodeState.AHEAD
        return NodeState.FRESH

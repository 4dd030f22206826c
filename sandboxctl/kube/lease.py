"""Lease-based leader election (``coordination.k8s.io/v1``), as client-go runs it.

A candidate reads the Lease; it takes it when it is absent, free, or not renewed for
``lease_duration`` as *this candidate observed it* (its own monotonic clock since the
record last changed, so clocks that disagree do not matter), and renews it every
``retry_period``. The write is a PUT carrying the resourceVersion it read: of two
candidates that try at once, one gets 409 and stays a follower. A leader that has not
renewed for ``renew_deadline`` (a control-plane outage, or a renewal that raised anything
else) stops leading: ``on_stopped`` runs, and after ``rejoin_after`` it is a candidate
again. The process goes on either way. A stop hands the lease back, so a successor need
not wait out the duration. The elector is a runnable (``lifecycle``): a process manager
runs it to start and stop its leader-elected group.

(``kubernetes.leaderelection`` in client v37 cannot be stopped, calls ``sys.exit`` on bad
durations and reads the global client configuration, so it is not used.)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from kubernetes import client

from sandboxctl.clock import Clock, SystemClock
from sandboxctl.core.errors import ConfigurationError
from sandboxctl.core.leases import LEASE_DURATION, REJOIN_AFTER, RENEW_DEADLINE, RETRY_PERIOD
from sandboxctl.kube.errors import KubeConflict, KubeError, KubeNotFound, call
from sandboxctl.lifecycle import Loop, Stop

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = 5.0


@dataclass
class _Term:
    """One term as leader: when it last renewed (monotonic seconds)."""

    renewed: float


@dataclass
class ElectionStats:
    acquired: int = 0
    lost: int = 0
    renewals: int = 0
    conflicts: int = 0


class LeaderElector:
    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        on_started: Callable[[], None],
        on_stopped: Callable[[], None],
        *,
        lease_duration: timedelta = LEASE_DURATION,
        renew_deadline: timedelta = RENEW_DEADLINE,
        retry_period: timedelta = RETRY_PERIOD,
        rejoin_after: timedelta = REJOIN_AFTER,
        clock: Clock | None = None,
    ) -> None:
        if not lease_duration > renew_deadline > retry_period > timedelta(0):
            raise ConfigurationError(
                "leader election needs lease duration > renew deadline > retry period > 0"
            )
        self._api = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._duration = lease_duration
        self._deadline = renew_deadline
        self._retry = retry_period
        self._rejoin = rejoin_after
        self._clock = clock or SystemClock()
        self._leading = threading.Event()
        self._observed: tuple[str, str, int] | None = None  # (holder, renewTime, transitions)
        self._observed_at = 0.0
        self.stats = ElectionStats()

    @property
    def is_leader(self) -> bool:
        return self._leading.is_set()

    # --- the loop -------------------------------------------------------------------------

    def run(self, stop: Stop) -> None:
        """Campaign every retry period until ``stop``; lead whenever the lease is won."""
        Loop(f"lease {self.namespace}/{self.name}", lambda: self._campaign(stop), self._retry).run(
            stop
        )

    def _campaign(self, stop: Stop) -> None:
        if not self._try():
            return
        self._lead(stop)
        if not stop.is_set():
            stop.wait(self._rejoin.total_seconds())

    def _lead(self, stop: Stop) -> None:
        self.stats.acquired += 1
        self._leading.set()
        log.info("lease %s/%s: %s is the leader", self.namespace, self.name, self.identity)
        term = _Term(self._clock.monotonic())
        leading = Stop()  # set by a stop, or once renewals miss the deadline
        stop.on_set(leading.set)
        renewer: threading.Thread | None = None
        try:
            self._on_started()
            # Renewals run on a thread of their own: a renewal may hang (etcd away, kube-
            # apiserver answering nothing: the client waits out its timeout and retries), and
            # the deadline must still end this term on time, as client-go's context does.
            renew = Loop(
                f"lease {self.namespace}/{self.name} renewal",
                lambda: self._renew(term, leading),
                self._retry,
                immediately=False,
            )
            renewer = threading.Thread(
                target=renew.run, args=(leading,), name=renew.name, daemon=True
            )
            renewer.start()
            deadline = self._deadline.total_seconds()
            while True:
                left = term.renewed + deadline - self._clock.monotonic()
                if left < 0:
                    self._lost()
                    leading.set()
                    break
                # Wake at the deadline, not a retry period after it.
                if leading.wait(min(self._retry.total_seconds(), left + 0.001)):
                    break
        finally:
            self._leading.clear()
            try:
                self._on_stopped()
            except Exception:
                log.exception("lease %s/%s: on_stopped failed", self.namespace, self.name)
            # A renewal still in flight could write the lease back after the release, and
            # this process would hold it for a whole duration: release only once it ended
            # (else the lease runs out on its own).
            if renewer is not None:
                renewer.join(REQUEST_TIMEOUT)
            if stop.is_set() and (renewer is None or not renewer.is_alive()):
                self._release()

    def _renew(self, term: _Term, leading: Stop) -> None:
        """One renewal; any failure (not only a KubeError) is a missed renewal. A renewal
        that ends after its term did counts for nothing."""
        try:
            renewed = self._try()
        except Exception:
            log.exception("lease %s/%s: renewal failed", self.namespace, self.name)
            renewed = False
        if renewed and not leading.is_set():
            term.renewed = self._clock.monotonic()
            self.stats.renewals += 1

    def _lost(self) -> None:
        self.stats.lost += 1
        log.warning(
            "lease %s/%s: %s could not renew within %ss; it stops leading and "
            "campaigns again in %ss",
            self.namespace,
            self.name,
            self.identity,
            self._deadline.total_seconds(),
            self._rejoin.total_seconds(),
        )

    # --- one attempt ----------------------------------------------------------------------

    def _try(self) -> bool:
        """Acquire or renew once; False when another holds it or the call failed."""
        what = f"lease {self.namespace}/{self.name}"
        try:
            lease = call(
                f"read {what}",
                lambda: self._api.read_namespaced_lease(
                    self.name, self.namespace, _request_timeout=REQUEST_TIMEOUT
                ),
            )
        except KubeNotFound:
            return self._create(what)
        except KubeError as error:
            log.debug("%s: %s", what, error)
            return False
        spec = lease.spec or client.V1LeaseSpec()
        holder = spec.holder_identity or ""
        record = (holder, str(spec.renew_time), int(spec.lease_transitions or 0))
        now = self._clock.monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = spec.lease_duration_seconds or self._duration.total_seconds()
        if holder and holder != self.identity and now - self._observed_at < duration:
            return False  # held, and renewed within its duration as we saw it
        stamp = self._clock.now()
        if holder != self.identity:
            spec.lease_transitions = int(spec.lease_transitions or 0) + (1 if holder else 0)
            spec.acquire_time = stamp
            spec.holder_identity = self.identity
        spec.renew_time = stamp
        spec.lease_duration_seconds = int(self._duration.total_seconds()) or 1
        lease.spec = spec
        try:
            updated = call(
                f"renew {what}",
                lambda: self._api.replace_namespaced_lease(
                    self.name, self.namespace, lease, _request_timeout=REQUEST_TIMEOUT
                ),
            )
        except KubeConflict:
            self.stats.conflicts += 1
            return False
        except KubeError as error:
            log.debug("%s: %s", what, error)
            return False
        self._observe(updated)
        return True

    def _create(self, what: str) -> bool:
        stamp = self._clock.now()
        lease = client.V1Lease(
            metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
            spec=client.V1LeaseSpec(
                holder_identity=self.identity,
                lease_duration_seconds=int(self._duration.total_seconds()) or 1,
                acquire_time=stamp,
                renew_time=stamp,
                lease_transitions=0,
            ),
        )
        try:
            created = call(
                f"create {what}",
                lambda: self._api.create_namespaced_lease(
                    self.namespace, lease, _request_timeout=REQUEST_TIMEOUT
                ),
            )
        except KubeError as error:
            if isinstance(error, KubeConflict):
                self.stats.conflicts += 1
            return False
        self._observe(created)
        return True

    def _observe(self, lease: client.V1Lease) -> None:
        spec = lease.spec or client.V1LeaseSpec()
        self._observed = (
            spec.holder_identity or "",
            str(spec.renew_time),
            int(spec.lease_transitions or 0),
        )
        self._observed_at = self._clock.monotonic()

    def _release(self) -> None:
        """Best effort: clear the holder so a successor takes over at once."""
        try:
            lease = self._api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=REQUEST_TIMEOUT
            )
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return
            lease.spec.holder_identity = None
            lease.spec.lease_duration_seconds = 1
            self._api.replace_namespaced_lease(
                self.name, self.namespace, lease, _request_timeout=REQUEST_TIMEOUT
            )
        except Exception as error:  # the lease then expires on its own
            log.debug("lease %s/%s: release failed: %s", self.namespace, self.name, error)

"""Mesh mode: the fleet read straight from the sandboxd agents, with no Kubernetes.

Every tick polls each known agent at once (``GET /v1/info``, then ``GET /v1/sandboxes``)
on a small thread pool. An answer becomes that node's inventory, stamped with this
reader's clock when it arrives, and is swapped into the snapshot under a lock; a node
that does not answer keeps its last inventory, whose stamp ages until the freshness rule
drops it. The snapshot has stall credit on (``stall_after`` = the poll interval), so a
poller cut off from every node freezes every stamp together and drops nobody.

A tick never waits longer than one poll interval: a node still busy when the tick ends
counts as failed for it (its answer is still taken when it comes), and is not asked again
until that request ends. ``snapshot()`` only reads an attribute and never blocks.

The two reads are made by the agent API's client (``sandboxctl.agentapi``), which also
turns the answers into models; any object with the same three methods (:class:`AgentReads`)
can be passed as ``client_factory``, as tests do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import replace
from datetime import timedelta

from sandboxctl.agentapi.client import AgentClient
from sandboxctl.clock import Clock, SystemClock
from sandboxctl.core.durations import format_duration
from sandboxctl.core.errors import ConfigurationError
from sandboxctl.core.snapshot import FleetSnapshot
from sandboxctl.inventory.live import (
    AgentReads,
    MeshStartError,
    PollResult,
    check_answers,
    describe,
    read_agent,
)
from sandboxctl.inventory.source import Listener, Subscribers
from sandboxctl.lifecycle import Loop, Stop

__all__ = [
    "DEFAULT_POLL_INTERVAL",
    "START_SECONDS",
    "AgentReads",
    "MeshInventorySource",
    "MeshStartError",
    "PollResult",
]

log = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL = timedelta(seconds=2)
START_SECONDS = 3.0  # how long start() waits for a slow seed's first answer
START_RETRY_SECONDS = 0.05


class MeshInventorySource:
    """An :class:`InventorySource` fed by polling sandboxd agents directly.

    ``seeds`` are agent addresses (``host:port`` or an origin), polled by that address;
    a node's identity is the ``node`` its info names and its published address is its
    ``advertise_addr``. ``start()`` polls once and fails loudly on a bad setup, then a
    daemon thread polls every ``poll_interval``; ``stop()`` ends it.
    """

    def __init__(
        self,
        seeds: Sequence[str],
        token: str | None,
        poll_interval: timedelta = DEFAULT_POLL_INTERVAL,
        clock: Clock | None = None,
        client_factory: Callable[[str], AgentReads] | None = None,
    ) -> None:
        addresses = tuple(dict.fromkeys(s.strip() for s in seeds if s.strip()))
        if not addresses:
            raise ConfigurationError("mesh mode needs at least one sandboxd seed address")
        if poll_interval <= timedelta(0):
            raise ConfigurationError(
                f"the mesh poll interval must be positive, got {format_duration(poll_interval)}"
            )
        self.seeds = addresses
        self.poll_interval = poll_interval
        self._token = token
        self._clock = clock or SystemClock()
        self._client_factory = client_factory or self._default_client
        self._snapshot = FleetSnapshot.empty(stall_after=poll_interval)
        self._subscribers = Subscribers()
        self._lock = threading.Lock()  # the snapshot swap, clients, counters
        self._tick_lock = threading.Lock()  # one tick at a time
        self._stopping = Stop()
        self._thread: threading.Thread | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._clients: dict[str, AgentReads] = {}
        self._in_flight: dict[str, Future[PollResult]] = {}
        self._node_of: dict[str, str] = {}  # address -> the node it last answered as
        self._streaks: dict[str, int] = {}  # address -> failed ticks in a row
        self.polls = 0
        self.failures: dict[str, int] = dict.fromkeys(addresses, 0)

    # --- the InventorySource protocol ---------------------------------------------------

    def snapshot(self) -> FleetSnapshot:
        return self._snapshot

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        return self._subscribers.subscribe(listener)

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Poll once, refuse a setup that cannot work, then poll in the background.

        A seed that is only slow (an agent busy starting its pools, a short
        ``poll_interval``) is given up to ``START_SECONDS`` to answer before start fails;
        one that refuses the connection or the token fails it at once."""
        if self._thread is not None:
            raise RuntimeError("the mesh inventory source is already started")
        deadline = time.monotonic() + START_SECONDS
        results = self.poll_once()
        while (
            not any(r.ok for r in results)
            and any(r.waiting for r in results)
            and time.monotonic() < deadline
        ):
            self._stopping.wait(START_RETRY_SECONDS)
            results = self.poll_once()
        waited = f"no answer within {format_duration(timedelta(seconds=START_SECONDS))}"
        results = tuple(replace(r, reason=waited) if r.waiting else r for r in results)
        try:
            check_answers(results)
        except MeshStartError:
            self.stop()
            raise
        self._thread = threading.Thread(
            target=self._run, name="sandboxctl-mesh-inventory", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop polling and close the clients; a request still running is abandoned."""
        self._stopping.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.poll_interval.total_seconds() + 5)
        with self._lock:
            executor, self._executor = self._executor, None
            clients, self._clients = list(self._clients.values()), {}
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        for client in clients:
            try:
                client.close()
            except Exception:  # closing must not hide the rest of the shutdown
                log.debug("closing a sandboxd client failed", exc_info=True)

    def __enter__(self) -> MeshInventorySource:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- polling ------------------------------------------------------------------------

    def poll_once(self) -> tuple[PollResult, ...]:
        """One tick, run here: every seed at once, returning within one poll interval.

        Results come in seed order. Usable before ``start()`` (tests drive it directly).
        """
        with self._tick_lock:
            executor = self._ensure_executor()
            budget = self.poll_interval.total_seconds()
            results: dict[str, PollResult] = {}
            submitted: dict[str, Future[PollResult]] = {}
            for address in self.seeds:
                running = self._in_flight.get(address)
                if running is not None and not running.done():
                    results[address] = PollResult(
                        address, reason="its previous poll has not answered yet", slow=True
                    )
                    continue
                future = executor.submit(self._poll_node, address)
                self._in_flight[address] = future
                submitted[address] = future
            wait(submitted.values(), timeout=budget)
            for address, future in submitted.items():
                if future.done() and not future.cancelled():
                    results[address] = future.result()
                else:
                    reason = f"no answer within {format_duration(self.poll_interval)}"
                    results[address] = PollResult(address, reason=reason, slow=True)
            ordered = tuple(results[address] for address in self.seeds)
            with self._lock:
                self.polls += 1
                for result in ordered:
                    if not result.ok:
                        self.failures[result.address] += 1
            self._log_streaks(ordered)
            return ordered

    def _run(self) -> None:
        poll = Loop("mesh inventory poll", self._poll_unless_stopped, self.poll_interval,
                    immediately=False, logger=log)  # fmt: skip
        poll.run(self._stopping)

    def _poll_unless_stopped(self) -> None:
        try:
            self.poll_once()
        except RuntimeError:
            if not self._stopping.is_set():  # else: stopped during the tick, as asked
                raise

    def _poll_node(self, address: str) -> PollResult:
        """Ask one agent; runs on the pool. A success is swapped in at once, even when
        it arrives after its tick gave up on it."""
        try:
            client = self._client(address)
        except Exception as error:  # one node's failure is data, never the poller's end
            return PollResult(address, reason=describe(error), error=error)
        result, inventory = read_agent(client, address, self._clock)
        if inventory is None:
            return result
        with self._lock:
            self._snapshot = self._snapshot.replace(inventory, seen_at=self._clock.monotonic())
            previous = self._node_of.get(address)
            self._node_of[address] = inventory.node
            others = [a for a, n in self._node_of.items() if n == inventory.node and a != address]
        self._subscribers.notify()
        if previous is not None and previous != inventory.node:
            log.warning(
                "sandboxd %s now answers as node %s (was %s); %s keeps its last inventory",
                address,
                inventory.node,
                previous,
                previous,
            )
        if others and previous != inventory.node:
            log.warning(
                "sandboxd %s and %s both answer as node %s; the newest answer wins",
                address,
                ", ".join(others),
                inventory.node,
            )
        return PollResult(address, node=inventory.node)

    def _log_streaks(self, results: Sequence[PollResult]) -> None:
        """Warn once when an agent starts failing, and say when it answers again."""
        for result in results:
            streak = self._streaks.get(result.address, 0)
            if result.ok:
                if streak:
                    log.info(
                        "sandboxd %s (node %s) answers again after %d failed polls",
                        result.address,
                        result.node,
                        streak,
                    )
                self._streaks[result.address] = 0
                continue
            if streak == 0:
                node = self._node_of.get(result.address)
                keeping = f"node {node} keeps its last inventory" if node else "no inventory yet"
                log.warning(
                    "sandboxd %s did not answer: %s; %s", result.address, result.reason, keeping
                )
            self._streaks[result.address] = streak + 1

    def _ensure_executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._stopping.is_set():
                raise RuntimeError("the mesh inventory source is stopped")
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=len(self.seeds), thread_name_prefix="sandboxctl-mesh-poll"
                )
            return self._executor

    def _client(self, address: str) -> AgentReads:
        with self._lock:
            client = self._clients.get(address)
            if client is None:
                client = self._client_factory(address)
                self._clients[address] = client
            return client

    def _default_client(self, address: str) -> AgentReads:
        return AgentClient(address, self._token, timeout=self.poll_interval.total_seconds())

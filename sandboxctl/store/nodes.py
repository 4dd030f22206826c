"""Calls from the store to host agents, with the fleet's root token.

Every call names a node by the address its fresh inventory advertises; the store never
dials a node it considers stale, so a stale node receives no request at all.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TypeVar

from sandboxctl.agentapi.client import AgentClient
from sandboxctl.agentapi.errors import AgentApiError, AgentError, AgentUnreachable

T = TypeVar("T")
LIVE_TIMEOUT = 0.5  # a live lookup's budget per node
FAN_OUT = 16


class NodeAccess:
    """One pooled client per node address; thread-safe."""

    def __init__(
        self,
        token: str | None,
        timeout: float = 10.0,
        client_factory: Callable[[str, str | None, float], AgentClient] | None = None,
    ) -> None:
        self._token = token
        self._timeout = timeout
        self._factory = client_factory or (lambda a, t, s: AgentClient(a, t, timeout=s))
        self._clients: dict[tuple[str, float], AgentClient] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=FAN_OUT, thread_name_prefix="node-fan-out")

    def client(self, address: str, timeout: float | None = None) -> AgentClient:
        key = (address, timeout or self._timeout)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = self._factory(address, self._token, key[1])
                self._clients[key] = client
            return client

    def live(self, address: str) -> AgentClient:
        """A client whose calls give up after the live-lookup budget."""
        return self.client(address, LIVE_TIMEOUT)

    def first_hit(
        self, addresses: Sequence[str], ask: Callable[[AgentClient], T | None]
    ) -> T | None:
        """Ask every node concurrently; the first non-empty answer wins and the rest are
        abandoned. A node that fails or times out counts as a miss."""
        if not addresses:
            return None
        pending: set[Future[T | None]] = {
            self._pool.submit(_quietly, ask, self.live(address)) for address in addresses
        }
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                result = future.result()
                if result is not None:
                    for other in pending:
                        other.cancel()
                    return result
        return None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()


def _quietly(ask: Callable[[AgentClient], T | None], client: AgentClient) -> T | None:
    try:
        return ask(client)
    except AgentApiError:
        return None


def undelivered(error: Exception) -> bool:
    """True when a claim certainly did not land, so another node may be tried: the node
    refused it (429), failed (5xx) or could not be dialled. A timeout after the request
    went out is not: the node may have granted it."""
    if isinstance(error, AgentError):
        return error.status == 429 or error.status >= 500
    return isinstance(error, AgentUnreachable) and error.undelivered

"""The owning-node index: which node answered for a name or a claim id last time.

Two generations of bounded size: when the current one fills it becomes the previous one
and a fresh one starts, and a hit in the previous generation is promoted. Memory stays
bounded at ``2 * size`` keys whatever the churn, and hot keys survive a rotation.
"""

from __future__ import annotations

import threading


class OwnerIndex:
    def __init__(self, size: int = 8192) -> None:
        self._size = size
        self._current: dict[tuple[str, str, str], str] = {}
        self._previous: dict[tuple[str, str, str], str] = {}
        self._lock = threading.Lock()

    def remember_name(self, namespace: str, name: str, node: str) -> None:
        self._put(("name", namespace, name), node)

    def remember_claim(self, namespace: str, claim_id: str, node: str) -> None:
        self._put(("claim", namespace, claim_id), node)

    def name(self, namespace: str, name: str) -> str | None:
        return self._get(("name", namespace, name))

    def claim(self, namespace: str, claim_id: str) -> str | None:
        return self._get(("claim", namespace, claim_id))

    def forget(self, namespace: str, name: str, claim_id: str) -> None:
        with self._lock:
            for key in (("name", namespace, name), ("claim", namespace, claim_id)):
                self._current.pop(key, None)
                self._previous.pop(key, None)

    def __len__(self) -> int:
        return len(self._current) + len(self._previous)

    def _put(self, key: tuple[str, str, str], node: str) -> None:
        with self._lock:
            if key not in self._current and len(self._current) >= self._size:
                self._previous = self._current
                self._current = {}
            self._current[key] = node

    def _get(self, key: tuple[str, str, str]) -> str | None:
        with self._lock:
            node = self._current.get(key)
            if node is not None:
                return node
            node = self._previous.pop(key, None)
            if node is not None:
                if len(self._current) >= self._size:
                    self._previous = self._current
                    self._current = {}
                self._current[key] = node
            return node

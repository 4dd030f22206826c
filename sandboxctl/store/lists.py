"""Lists with Kubernetes semantics: ``limit`` and ``continue`` page through one state.

A list answers from one ledger state and carries its version. With ``limit`` it answers
at most that many objects and, when more may follow, a ``continue`` token naming the
state's version and the last name answered; the next page reads the same state after that
name, so pages neither repeat nor skip an object whatever changed in between. A state is
kept for ``TOKEN_SECONDS`` after its last page was answered (at most ``KEPT_STATES`` of
them); a token for one no longer kept is Expired (410), as kube-apiserver answers a
continue token past compaction. A token this server could not have written is BadContinue
(400).
"""

from __future__ import annotations

import base64
import binascii
import bisect
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from sandboxctl.core.errors import InvalidValueError
from sandboxctl.store.errors import Expired
from sandboxctl.store.ledger import Held, Name, State
from sandboxctl.store.query import Query

TOKEN_SECONDS: Final = 300.0  # kube-apiserver compacts every five minutes
KEPT_STATES: Final = 64


class BadContinue(InvalidValueError):
    """A ``continue`` token this server did not write."""

    def __init__(self) -> None:
        super().__init__("continue: the token is not one this server gave")


@dataclass(frozen=True, slots=True)
class ListPage:
    items: list[dict[str, Any]]
    version: int
    continue_token: str | None = None
    remaining: int | None = None  # objects after this page, when cheaply known


def select(state: State, query: Query, after: Name | None = None) -> Iterator[Held]:
    """The objects of ``state`` the query accepts, sorted by (namespace, name), from the
    first name after ``after``. A pinned query answers the first holder of its name that
    it accepts (a duplicate, when it rejects the winner)."""
    held = state.held
    pin = query.pin
    if pin is not None:
        found = held.get(pin)
        visible = found.visible(query.accepts) if found is not None else None
        if visible is not None and (after is None or pin > after):
            yield visible
        return
    names = state.names()
    start, end = 0, len(names)
    if query.namespace is not None:  # (ns, x) sorts before (ns + NUL,)
        start = bisect.bisect_left(names, (query.namespace,))
        end = bisect.bisect_left(names, (query.namespace + "\x00",), lo=start)
    if after is not None:
        start = max(start, bisect.bisect_right(names, after, lo=start, hi=end))
    everything = query.selects_all_in_namespace
    for i in range(start, end):
        found = held[names[i]]
        if everything or query.accepts(found.located):
            yield found


class ListStates:
    """The states that continue tokens name; thread-safe."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._states: OrderedDict[int, tuple[State, float]] = OrderedDict()
        self._lock = threading.Lock()

    def page(self, state: State, query: Query, after: Name | None, limit: int | None) -> ListPage:
        found = select(state, query, after)
        if not limit:
            return ListPage([h.object for h in found], state.version)
        items: list[dict[str, Any]] = []
        last: Name | None = None
        for held in found:
            if len(items) == limit:
                self._keep(state)
                token = _encode(state.version, last)
                remaining = None
                if query.selects_all_in_namespace and query.namespace is None and last:
                    remaining = len(state.names()) - bisect.bisect_right(state.names(), last)
                return ListPage(items, state.version, token, remaining)
            items.append(held.object)
            last = held.located.entry.namespaced_name
        return ListPage(items, state.version)

    def resume(self, token: str, current: State) -> tuple[State, Name]:
        """The state and the last name a token names; Expired when that state is gone."""
        version, after = _decode(token)
        if version == current.version:
            return current, after
        with self._lock:
            kept = self._states.get(version)
            if kept is None or kept[1] < self._monotonic():
                self._states.pop(version, None)
                raise Expired(version, None, current.version)
            return kept[0], after

    def _keep(self, state: State) -> None:
        with self._lock:
            self._states[state.version] = (state, self._monotonic() + TOKEN_SECONDS)
            self._states.move_to_end(state.version)
            while len(self._states) > KEPT_STATES:
                self._states.popitem(last=False)


def _encode(version: int, after: Name | None) -> str:
    assert after is not None
    text = json.dumps({"v": version, "a": list(after)}, separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _decode(token: str) -> tuple[int, Name]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        body = json.loads(raw)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise BadContinue() from None
    if not isinstance(body, dict):
        raise BadContinue()
    version, after = body.get("v"), body.get("a")
    if (
        isinstance(version, bool)
        or not isinstance(version, int)
        or not isinstance(after, list)
        or len(after) != 2
        or not all(isinstance(part, str) for part in after)
    ):
        raise BadContinue()
    return version, (after[0], after[1])

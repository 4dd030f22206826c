"""One watch's stream: the objects first when it starts from now (the WatchList
initial-events-end bookmark after them when asked), then every event past its cursor that
it shows (an object leaving the selector is DELETED, one entering it ADDED), bookmarks,
and 410 Expired for a version older than the event log or once the store expires every
watch. The connection itself (its head, chunking and end) is the server's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sandboxctl_testing.kubeapi import discovery
from sandboxctl_testing.kubeapi.resources import ResourceType
from sandboxctl_testing.kubeapi.store import ApiError, Event, Store


@dataclass(frozen=True)
class WatchRequest:
    resource: ResourceType
    namespace: str  # "" for every namespace
    labels: str
    fields: str
    matches: Callable[[dict[str, Any]], bool]
    bookmarks: bool
    initial_end: bool  # sendInitialEvents: the objects, then the initial-events-end bookmark
    as_table: bool
    deadline: float  # monotonic
    version: str  # the resourceVersion asked for, digits; "" or "0": from now

    @property
    def from_now(self) -> bool:
        return self.version in ("", "0") or self.initial_end


class Watch:
    """Reads the store under its lock; writes each line with ``chunk``."""

    def __init__(
        self,
        store: Store,
        request: WatchRequest,
        bookmark_seconds: float,
        chunk: Callable[[bytes], None],
    ) -> None:
        self._store = store
        self._request = request
        self._bookmark_seconds = bookmark_seconds
        self._chunk = chunk
        self._first: list[bytes] = []
        self._cursor = 0
        self._gone = False
        self._expired = self._dropped = 0

    def open(self) -> None:
        """Where the stream starts, read before the answer's head is sent."""
        store, request = self._store, self._request
        with store.lock:
            self._expired, self._dropped = store.expired, store.dropped
            if request.from_now:
                items, self._cursor = store.select(
                    request.resource, request.namespace, request.labels, request.fields
                )
                self._first = [self._line("ADDED", item) for item in items]
            else:
                self._cursor = int(request.version)
                self._gone = self._cursor < store.compacted

    def run(self) -> bool:
        """Stream until the watch ends; False when the store dropped every watch (its
        connection must then be cut without a word)."""
        request = self._request
        if self._gone:
            problem = f"too old resource version: {self._cursor} ({self._store.compacted})"
            self._chunk(_error_line(ApiError(410, "Expired", problem)))
            return True
        for line in self._first:
            self._chunk(line)
        if request.initial_end and request.bookmarks:
            self._chunk(_bookmark(request.resource, self._cursor, initial_end=True))
        next_bookmark = time.monotonic() + self._bookmark_seconds
        while True:
            batch = self._next_batch(next_bookmark)
            if batch is None:
                return False
            lines, final = batch
            for line in lines:
                self._chunk(line)
            if final:
                return True
            now = time.monotonic()
            if now >= request.deadline:
                if request.bookmarks:
                    self._chunk(_bookmark(request.resource, self._cursor))
                return True
            if request.bookmarks and now >= next_bookmark:
                self._chunk(_bookmark(request.resource, self._cursor))
                next_bookmark = now + self._bookmark_seconds

    def _next_batch(self, next_bookmark: float) -> tuple[list[bytes], bool] | None:
        """The next lines once something is due, and whether they end the stream; None
        when the store dropped every watch."""
        store = self._store
        with store.lock:
            self._wait(next_bookmark)
            if store.dropped != self._dropped:
                return None
            lines = self._lines()
            final = store.closed or bool(lines and lines[-1].startswith(b'{"type":"ERROR"'))
        return lines, final

    def _wait(self, next_bookmark: float) -> None:
        """Under the store's lock, until an event past the cursor, the store closing,
        expiring or dropping its watches, the deadline, or a bookmark is due."""
        store, request = self._store, self._request
        wake = min(request.deadline, next_bookmark) if request.bookmarks else request.deadline
        while True:
            now = time.monotonic()
            if store.closed or store.dropped != self._dropped or store.expired != self._expired:
                return
            if now >= request.deadline:
                return
            if (store._rvs and store._rvs[-1] > self._cursor) or self._cursor < store.compacted:
                return
            if request.bookmarks and now >= next_bookmark:
                return
            store.changed.wait(wake - now)

    def _lines(self) -> list[bytes]:
        """Under the store's lock, what the stream says next: 410 once the store expired
        every watch, else the events past the cursor that this watch shows."""
        store, request = self._store, self._request
        if store.expired != self._expired:
            problem = f"too old resource version: {self._cursor} ({store.rv})"
            return [_error_line(ApiError(410, "Expired", problem))]
        if store.closed:
            return []
        try:
            events = store.events_after(self._cursor)
        except ApiError as error:
            return [_error_line(error)]
        lines = []
        for event in events:
            if event.storage == request.resource.storage and (
                not request.namespace or event.namespace == request.namespace
            ):
                shown = self._event_line(event)
                if shown is not None:
                    lines.append(shown)
        self._cursor = max(self._cursor, store.rv)
        return lines

    def _event_line(self, event: Event) -> bytes | None:
        """The event as this watch's selector sees it, or None when it sees nothing."""
        kind = _seen_as(event, self._request.matches)
        if kind is None:
            return None
        if self._request.as_table:
            return self._line(kind, event.new)
        encoded = self._store.encode(self._request.resource, event)
        return b'{"type":"' + kind.encode() + b'","object":' + encoded + b"}\n"

    def _line(self, kind: str, obj: dict[str, Any]) -> bytes:
        resource = self._request.resource
        shown: Any = obj
        if self._request.as_table:
            shown = discovery.table(resource, [obj], datetime.now(UTC), None)
        return json.dumps({"type": kind, "object": shown}, separators=(",", ":")).encode() + b"\n"


def _seen_as(event: Event, matches: Callable[[dict[str, Any]], bool]) -> str | None:
    """What a watch with this selector sees of an event: the object entering the
    selector is ADDED, leaving it DELETED, staying in it MODIFIED."""
    was = event.old is not None and event.type != "ADDED" and matches(event.old)
    if event.type == "DELETED":
        return "DELETED" if was else None
    now = matches(event.new)
    if was and now:
        return "MODIFIED"
    if now:
        return "ADDED"
    return "DELETED" if was else None


def _error_line(error: ApiError) -> bytes:
    status = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": error.message,
        "reason": error.reason,
        "code": error.code,
    }
    return json.dumps({"type": "ERROR", "object": status}, separators=(",", ":")).encode() + b"\n"


def _bookmark(resource: ResourceType, rv: int, initial_end: bool = False) -> bytes:
    metadata: dict[str, Any] = {"resourceVersion": str(rv)}
    if initial_end:
        metadata["annotations"] = {"k8s.io/initial-events-end": "true"}
    obj = {"kind": resource.kind, "apiVersion": resource.group_version, "metadata": metadata}
    return json.dumps({"type": "BOOKMARK", "object": obj}, separators=(",", ":")).encode() + b"\n"

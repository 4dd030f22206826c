"""One list-then-watch informer: a cache of one resource that others read without API
calls, and handlers told of every change.

The loop, as client-go's reflector runs it:

1. LIST, keep the items and the list's resourceVersion (the cursor);
2. WATCH from the cursor with bookmarks and a server-side timeout; every event, BOOKMARK
   included, moves the cursor (an opaque string, never compared);
3. when the stream ends at its timeout, WATCH again from the cursor;
4. on 410 Expired, LIST again at once and diff against the cache, so handlers stay
   level-triggered: DELETED for what is gone, ADDED for what is new, MODIFIED for what
   changed (by resourceVersion); nothing for what did not;
5. on any other failure (no answer, a reset, 5xx, 429, even 403 or 404 while a CRD or a
   role is being installed), back off (exponential with jitter, through tenacity) and
   try again from the cursor (a 410 there leads to 4).

``resync`` re-delivers every cached object to the handlers as ``SYNC`` every period,
from the cache (no API call), for handlers that reconcile on a timer. ``keep`` is what
the cache (and so a resync) holds of each object, all of it unless told, as client-go's
transform: a handler that keeps its own form of the objects caches only their metadata.
Handlers run one at a time on the informer's threads; one that raises is logged and does
not stop it.

(``kubernetes.informer.SharedInformer`` in client v37 asks for no bookmarks, retries on
a fixed 5 s and relists on resync, so it is not used.)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import tenacity

from sandboxctl.kube.errors import KubeError, KubeExpired, kube_error
from sandboxctl.kube.resources import CustomObjects, WatchStream
from sandboxctl.lifecycle import Loop, Stop

log = logging.getLogger(__name__)

ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"
SYNC = "SYNC"
WATCH_SECONDS = 300
BACKOFF_INITIAL = 0.5
BACKOFF_MAX = 30.0

Key = tuple[str, str]  # (namespace or "", name)
Handler = Callable[[str, dict[str, Any]], None]


@dataclass
class InformerStats:
    """What the informer did, for tests, logs and metrics."""

    lists: int = 0
    watches: int = 0
    expired: int = 0  # 410s that led to a relist
    failures: int = 0  # calls that failed and were retried after a backoff
    events: int = 0  # ADDED, MODIFIED and DELETED delivered


def key_of(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


class Informer:
    def __init__(
        self,
        objects: CustomObjects,
        handler: Handler | None = None,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
        watch_seconds: int = WATCH_SECONDS,
        resync: timedelta | None = None,
        backoff_initial: float = BACKOFF_INITIAL,
        backoff_max: float = BACKOFF_MAX,
        name: str = "",
        keep: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self.objects = objects
        self.name = name or objects.resource.plural
        self._handler = handler
        self._namespace = namespace
        self._labels = label_selector
        self._fields = field_selector
        self._watch_seconds = watch_seconds
        self._resync = resync
        self._backoff = (backoff_initial, backoff_max)
        self._keep = keep
        self._cache: dict[Key, dict[str, Any]] = {}
        self._cache_lock = threading.Lock()
        self._deliver_lock = threading.Lock()  # handlers run one at a time
        self._cursor: str | None = None
        self._stopping = Stop()
        self._synced = threading.Event()
        self._watcher: WatchStream | None = None
        self._threads: list[threading.Thread] = []
        self.stats = InformerStats()
        self.last_error: KubeError | None = None

    # --- reads: the cache, never the API ---------------------------------------------------

    def get(self, name: str, namespace: str = "") -> dict[str, Any] | None:
        with self._cache_lock:
            return self._cache.get((namespace, name))

    def items(self) -> list[dict[str, Any]]:
        with self._cache_lock:
            return list(self._cache.values())

    @property
    def synced(self) -> bool:
        """True once the first list is in the cache and the handlers have seen it."""
        return self._synced.is_set()

    @property
    def resource_version(self) -> str | None:
        return self._cursor

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        if self._threads:
            raise RuntimeError(f"informer {self.name} is already started")
        self._threads.append(
            threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True)
        )
        if self._resync is not None:
            resync = Loop(f"informer {self.name} resync", self._resync_once, self._resync,
                          immediately=False, logger=log)  # fmt: skip
            self._threads.append(
                threading.Thread(
                    target=resync.run, args=(self._stopping,), name=f"resync-{self.name}",
                    daemon=True,
                )
            )  # fmt: skip
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stopping.set()
        watcher = self._watcher
        if watcher is not None:
            watcher.stop()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=10)

    # --- the loop -----------------------------------------------------------------------

    def _run(self) -> None:
        initial, maximum = self._backoff
        while not self._stopping.is_set():
            retrying = tenacity.Retrying(
                retry=tenacity.retry_if_exception_type(KubeError),
                wait=tenacity.wait_exponential_jitter(
                    multiplier=initial, max=maximum, jitter=initial
                ),
                stop=tenacity.stop_when_event_set(self._stopping),  # type: ignore[arg-type]
                sleep=self._pause,
                before_sleep=self._failed,
                reraise=True,
            )
            try:
                retrying(self._list_and_watch)
            except KubeError:
                return  # stopping: the last failure is of no interest
            except Exception:  # a bug must not end the cache's life silently
                log.exception("informer %s failed; starting over", self.name)
                self._cursor = None
                self._stopping.wait(maximum)

    def _list_and_watch(self) -> None:
        """One round: relist when there is no cursor, then watch until the stream ends.
        Returns when it ended normally or on 410 (the next round relists at once)."""
        if self._cursor is None:
            self._relist()
        if self._stopping.is_set():
            return
        try:
            self._watch()
        except KubeExpired:
            self.stats.expired += 1
            log.info("informer %s: watch expired (410); relisting", self.name)
            self._cursor = None

    def _relist(self) -> None:
        listed = self.objects.list(self._namespace, self._labels, self._fields)
        self.stats.lists += 1
        fresh = {key_of(obj): obj for obj in listed.items}
        kept = fresh if self._keep is None else {k: self._keep(o) for k, o in fresh.items()}
        with self._cache_lock:
            old, self._cache = self._cache, kept
        changes: list[tuple[str, dict[str, Any]]] = [
            (DELETED, obj) for key, obj in old.items() if key not in fresh
        ]
        for key, obj in fresh.items():
            before = old.get(key)
            if before is None:
                changes.append((ADDED, obj))
            elif _version(before) != _version(obj):
                changes.append((MODIFIED, obj))
        self._cursor = listed.resource_version
        for kind, obj in changes:
            self._deliver(kind, obj)
        self._synced.set()  # after the handlers: a synced reader sees the whole first list

    def _watch(self) -> None:
        assert self._cursor is not None
        stream = self.objects.watch(
            self._cursor,
            self._watch_seconds,
            self._namespace,
            self._labels,
            self._fields,
        )
        self._watcher = stream
        self.stats.watches += 1
        try:
            for event in stream:
                if self._stopping.is_set():
                    return
                self._apply(event)
        except Exception as error:
            if self._stopping.is_set():
                return
            raise kube_error(error, f"watch {self.objects.resource.qualified}") from error
        finally:
            self._watcher = None

    def _apply(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        version = _version(obj)
        if kind == "BOOKMARK":
            if version:
                self._cursor = version
            return
        if kind not in (ADDED, MODIFIED, DELETED):
            return
        key = key_of(obj)
        with self._cache_lock:
            if kind == DELETED:
                self._cache.pop(key, None)
            else:
                self._cache[key] = obj if self._keep is None else self._keep(obj)
        if version:
            self._cursor = version
        self._deliver(kind, obj)

    def _deliver(self, kind: str, obj: dict[str, Any]) -> None:
        if kind != SYNC:
            self.stats.events += 1
        if self._handler is None:
            return
        with self._deliver_lock:
            try:
                self._handler(kind, obj)
            except Exception:
                log.exception("informer %s: a handler failed on %s", self.name, kind)

    def _pause(self, seconds: float) -> None:
        self._stopping.wait(seconds)

    def _resync_once(self) -> None:
        if self._synced.is_set():
            for obj in self.items():
                self._deliver(SYNC, obj)

    def _failed(self, state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        self.stats.failures += 1
        if isinstance(error, KubeError):
            self.last_error = error
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        level = logging.WARNING if state.attempt_number == 1 else logging.DEBUG
        log.log(level, "informer %s: %s; retrying in %.1fs", self.name, error, wait)


def metadata_only(obj: dict[str, Any]) -> dict[str, Any]:
    """A ``keep`` for handlers that hold their own form of each object."""
    return {"metadata": obj.get("metadata") or {}}


def _version(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")

"""Reads after writes through this server, end to end over real agents.

The fleet is ``bench_e2b.real_fleet()``: two real host agents (bubblewrap, a warm pool of
8 ``base`` sandboxes each), a mesh source polling them every 0.2 s and one store with
claim routing; the e2b app and the Kubernetes-style app (``create_kube_app``, one bearer
token for every namespace) are served over that one store on loopback HTTP (uvicorn in a
thread, as ``bench_e2b`` serves them).
Every create waits (untimed) until the inventories report at least 8 warm sandboxes, and
every sandbox is deleted (untimed) before the next create. Skipped without root and
bubblewrap.

1. ``create then list (e2b)``: ``POST /sandboxes`` (``templateID: base``), then at once
   ``GET /v2/sandboxes`` (one page of 100; httpx, keep-alive); the new ``sandboxID`` must
   be on that first read, which this server answers before any agent republishes.
   Reported as ``visible`` of 100; target 100 of 100.
2. ``watch event after a create``: a watch ``GET .../namespaces/default/sandboxes?watch=1``
   from the list's resourceVersion is read line by line in a thread; then ``POST``
   a Sandbox (image ``base``) to the same app, 40 times. Timed from the create's response
   (its last byte read) to the arrival of the ADDED line naming it; an ADDED line that came
   first counts as 0 (``before_response``). Target p50 <= 50 ms.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx

from benchmarks import Row, with_target
from benchmarks.bench_e2b import (
    KEY,
    WARM,
    e2b_config,
    real_fleet,
    serving,
    unavailable,
    wait_until,
    warm_count,
)
from benchmarks.timing import Timing
from sandboxctl.apiserver.auth import ALL_NAMESPACES, KubeTokens
from sandboxctl.apiserver.e2b import create_e2b_app
from sandboxctl.apiserver.kube import PREFIX, create_kube_app
from sandboxctl.core.sandboxes import API_VERSION, KIND
from sandboxctl.store import SandboxStore

NAME = "reads"
LIST_CREATES = 100
WATCH_CREATES = 40
WATCH_TARGET_MS = 50.0
EVENT_WAIT_SECONDS = 10.0
SANDBOXES = f"{PREFIX}/namespaces/default/sandboxes"
KUBE_TOKEN = "bench-kube-token"
AUTH = {"Authorization": f"Bearer {KUBE_TOKEN}"}


def run() -> Iterator[Row]:
    reason = unavailable()
    if reason is not None:
        yield _row("create then list / watch after create", skipped=reason)
        return
    stopping = threading.Event()
    with (
        real_fleet() as store,
        serving(create_e2b_app(store, e2b_config())) as e2b_url,
        serving(_kube_app(store, stopping)) as kube_url,
    ):
        try:
            yield _create_then_list(store, e2b_url)
            yield _watch_after_create(store, kube_url)
        finally:
            stopping.set()  # open watches end at their next wake, so the server can stop


def _warm(store: SandboxStore) -> None:
    wait_until(lambda: warm_count(store) >= WARM, 30)


def _create_then_list(store: SandboxStore, url: str) -> Row:
    visible = 0
    with httpx.Client(base_url=url, headers={"X-API-Key": KEY}, timeout=30) as http:
        for _ in range(LIST_CREATES):
            _warm(store)
            created = http.post("/sandboxes", json={"templateID": "base"})
            assert created.status_code == 201, created.text
            sandbox_id = created.json()["sandboxID"]
            listed = http.get("/v2/sandboxes", params={"limit": 100})
            assert listed.status_code == 200, listed.text
            visible += any(item["sandboxID"] == sandbox_id for item in listed.json())
            killed = http.delete(f"/sandboxes/{sandbox_id}")
            assert killed.status_code == 204, killed.text
    return with_target(
        _row(
            "create then list through the e2b API: visible on the first read",
            visible=visible,
            creates=LIST_CREATES,
        ),
        visible == LIST_CREATES,
        f"{LIST_CREATES} of {LIST_CREATES}",
    )


class _Events:
    """A watch read in a thread: the arrival time of each ADDED line, by name."""

    def __init__(self, http: httpx.Client, version: str) -> None:
        self._http = http
        self._version = version
        self._added: dict[str, int] = {}
        self._changed = threading.Condition()
        self._opened = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        if not self._opened.wait(10):
            raise RuntimeError("the watch did not open")

    def _read(self) -> None:
        params = {"watch": "1", "resourceVersion": self._version, "timeoutSeconds": "600"}
        try:
            with self._http.stream("GET", SANDBOXES, params=params, timeout=None) as reply:
                reply.raise_for_status()
                self._opened.set()
                for line in reply.iter_lines():
                    arrived = time.perf_counter_ns()
                    if not line:
                        continue
                    event = json.loads(line)
                    if event["type"] == "ADDED":
                        with self._changed:
                            self._added[event["object"]["metadata"]["name"]] = arrived
                            self._changed.notify_all()
        except BaseException as error:  # surfaced by wait(), whatever it was
            self.error = error
            self._opened.set()
            with self._changed:
                self._changed.notify_all()

    def wait(self, name: str, seconds: float) -> int | None:
        """When the ADDED line for ``name`` arrived (perf_counter_ns), None by ``seconds``."""
        deadline = time.monotonic() + seconds
        with self._changed:
            while name not in self._added:
                left = deadline - time.monotonic()
                if self.error is not None or left <= 0:
                    return None
                self._changed.wait(left)
            return self._added[name]


def _kube_app(store: SandboxStore, stopping: threading.Event) -> Any:
    tokens = KubeTokens({KUBE_TOKEN: frozenset({ALL_NAMESPACES})})
    return create_kube_app(store, tokens, stopping=stopping.is_set)


def _watch_after_create(store: SandboxStore, url: str) -> Row:
    samples: list[float] = []
    before_response = missed = 0
    with (
        httpx.Client(base_url=url, headers=AUTH, timeout=30) as http,
        httpx.Client(base_url=url, headers=AUTH) as watching,
    ):
        listed = http.get(SANDBOXES)
        assert listed.status_code == 200, listed.text
        events = _Events(watching, listed.json()["metadata"]["resourceVersion"])
        for i in range(WATCH_CREATES):
            _warm(store)
            name = f"bench-watch-{i}"
            created = http.post(SANDBOXES, json=_sandbox(name))
            answered = time.perf_counter_ns()
            assert created.status_code == 201, created.text
            arrived = events.wait(name, EVENT_WAIT_SECONDS)
            if arrived is None:
                missed += 1
            else:
                before_response += arrived < answered
                samples.append(max(0, arrived - answered))
            deleted = http.delete(f"{SANDBOXES}/{name}")
            assert deleted.status_code == 200, deleted.text
        if events.error is not None:
            raise RuntimeError(f"the watch failed: {events.error!r}")
    row = _row(
        "watch event after a create through this server (create answered -> ADDED line)",
        before_response=before_response,
        missed=missed,
    )
    if not samples:
        return with_target(row, False, f"p50 <= {WATCH_TARGET_MS:g} ms")
    timing = Timing(tuple(sorted(samples)))
    row.update(timing.figures("ms", minimum=False))
    met = missed == 0 and timing.p50_ns / 1e6 <= WATCH_TARGET_MS
    return with_target(row, met, f"p50 <= {WATCH_TARGET_MS:g} ms, none missed")


def _sandbox(name: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "base"}]}}},
    }


def _row(case: str, **figures: Any) -> Row:
    return {"benchmark": NAME, "case": case, **figures}

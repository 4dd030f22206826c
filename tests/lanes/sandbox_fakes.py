"""A stand-in kit for the sandbox lanes' own tests: two hosts, two replicas and a proxy
answered in memory through ``httpx.MockTransport``, on a clock that moves only when a
lane waits. It behaves as sandboxctl should; each name in ``broken`` makes one part
misbehave the way a lane exists to catch:

- ``restart_drops``: stopping B's publisher drops B (its sandboxes leave the lists, the
  watches get DELETED, the replicas log it);
- ``unstamped_stale``: a node whose publisher does not stamp is stale (upstream's newest rule);
- ``keeps_stamp``: an unstamping publisher's apply leaves the old ``publishedAt``;
- ``holder_exits``: replica 0 (the lease holder) exits when the control plane goes;
- ``proxy_exits``: the envd proxy stops answering when the control plane goes;
- ``outage_hides_b``: the replicas stop listing B's sandboxes in an outage;
- ``no_leader``: replica 0 never led (the lane would test a replica with no lease);
- ``asks_other``: an e2b read by id also asks the node that does not own the sandbox;
- ``pinned_fallback`` (a fix, not a fault): a pinned list whose pick its selectors reject
  answers a duplicate they accept (docs/api.md#duplicates) instead of nothing.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs

import httpx

from sandboxctl.agentapi import AgentClient
from sandboxctl.core.timestamps import format_rfc3339
from sandboxctl.lanes.kit import Host, Replica
from sandboxctl.lanes.model import LaneTimeout, Windows

T = TypeVar("T")
T0 = datetime(2026, 12, 1, tzinfo=UTC)
SANDBOXES = "/apis/agents.x-k8s.io/v1beta1/sandboxes"
NAMESPACED = "/apis/agents.x-k8s.io/v1beta1/namespaces/default/sandboxes"
PHASE = "sandbox.cocoonstack.io/phase"


@dataclass
class Sandbox:
    id: str
    node: str
    ref: str  # namespace/name
    phase: str = "Running"


class FakeProgress:
    """Polls without sleeping: each poll moves the fleet's clock by 0.1 s."""

    def __init__(self, fleet: FakeFleet) -> None:
        self.fleet = fleet
        self.notes: list[str] = []

    def wait_for(self, what: str, check: Callable[[], T | None], bound: float) -> T:
        start = self.fleet.now
        while True:
            found = check()
            if found is not None and found is not False:
                return found
            if self.fleet.now - start > bound:
                raise LaneTimeout(f"{what}: not within {bound:.1f} s")
            self.fleet.now += 0.1

    def note(self, text: str) -> None:
        self.notes.append(text)


class _Client(httpx.Client):
    """Tells the fake when it is closed, so a watch's stream can end."""

    def __init__(self, closed: threading.Event, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._closed = closed

    def close(self) -> None:
        self._closed.set()
        super().close()


class FakeFleet:
    name = "fake"
    windows = Windows(publish=3.0, stale_after=9.0)
    domain = "fake.test"
    kubeconfig = Path("/nonexistent/kubeconfig")
    warm_pool = "default/pool"
    template = "base"
    proxy_url = "http://proxy.fake"

    def __init__(self, *broken: str) -> None:
        self.broken = set(broken)
        self.now = 0.0
        self.a = Host("A", "lanes-a", "http://a.fake:7777")
        self.b = Host("B", "lanes-b", "http://b.fake:7777")
        self.replicas = (
            Replica("replica-0", "http://r0.fake", "http://r0-e2b.fake"),
            Replica("replica-1", "http://r1.fake", "http://r1-e2b.fake"),
        )
        self.sandboxes: dict[str, Sandbox] = {}
        self.publisher = {self.a.node: "stamping", self.b.node: "stamping"}
        self.dropped: set[str] = set()
        self.frozen: dict[str, float] = {}  # node -> its last stamp, while it publishes none
        self.control_plane = True
        self.dead: set[str] = set()  # replicas that exited
        self.asked = {self.a.node: 0, self.b.node: 0}  # per-sandbox requests
        self.logs = {r.name: "" for r in self.replicas}
        if "no_leader" not in self.broken:
            self.logs["replica-0"] = "lease sandbox-system/driver: r0_1_abc is the leader\n"
        self.events: list[str] = []  # watch lines after the opening bursts
        self.streams: list[list[int]] = []  # per open watch: lines it handed over
        self._ids = itertools.count(1)
        self._placement = itertools.cycle((self.a.node, self.b.node))
        self.operations: list[str] = []

    def clock(self) -> float:
        return self.now

    # --- what a reader sees ------------------------------------------------------------

    def fresh(self, node: str) -> bool:
        if node in self.dropped:
            return False
        if self.publisher[node] == "unstamped" and "unstamped_stale" in self.broken:
            return False
        return not (
            not self.control_plane and node == self.b.node and "outage_hides_b" in self.broken
        )

    def visible(self) -> list[Sandbox]:
        return [s for s in self.sandboxes.values() if self.fresh(s.node)]

    def by_name(self) -> dict[str, Sandbox]:
        """One object per name: the first node's, in node-name order (docs/api.md)."""
        out: dict[str, Sandbox] = {}
        for sandbox in sorted(self.visible(), key=lambda s: s.node):
            out.setdefault(sandbox.ref, sandbox)
        return out

    def inventory(self, kit: object, host: Host) -> dict[str, Any] | None:
        if not self.control_plane:
            return None
        body: dict[str, Any] = {"metadata": {"name": host.node}}
        state = self.publisher[host.node]
        if state != "unstamped" or "keeps_stamp" in self.broken:
            stamp = self.frozen.get(host.node, self._last_publish())
            body["publishedAt"] = format_rfc3339(T0 + timedelta(seconds=stamp))
        return body

    def _last_publish(self) -> float:
        return self.now // self.windows.publish * self.windows.publish

    # --- the protocol: clients ---------------------------------------------------------

    def kube(self, replica: Replica) -> httpx.Client:
        closed = threading.Event()
        return _Client(
            closed,
            base_url=replica.kube_url,
            transport=httpx.MockTransport(lambda r: self._kube(replica, r, closed)),
        )

    def e2b(self, replica: Replica) -> httpx.Client:
        closed = threading.Event()
        return _Client(
            closed,
            base_url=replica.e2b_url,
            transport=httpx.MockTransport(lambda r: self._e2b(replica, r)),
        )

    def proxy(self) -> httpx.Client:
        return httpx.Client(base_url=self.proxy_url, transport=httpx.MockTransport(self._proxy))

    def _proxy(self, request: httpx.Request) -> httpx.Response:
        if not self.control_plane and "proxy_exits" in self.broken:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(204)

    def agent(self, host: Host) -> AgentClient:
        return AgentClient(
            host.agent_url, "root", transport=httpx.MockTransport(lambda r: self._agent(host, r))
        )

    # --- the protocol: faults and facts ------------------------------------------------

    def stop_publisher(self, host: Host) -> None:
        self.operations.append(f"stop_publisher {host.label}")
        self.publisher[host.node] = "stopped"
        self.frozen[host.node] = self._last_publish()
        if "restart_drops" in self.broken:
            self.dropped.add(host.node)
            for s in self.sandboxes.values():
                if s.node == host.node:
                    self._event("DELETED", s)
            for name in self.logs:
                self.logs[name] += f"node {host.node} went stale\n"
            self._deliver()

    def start_publisher(self, host: Host, stamp: bool = True) -> None:
        self.operations.append(f"start_publisher {host.label} stamp={stamp}")
        self.publisher[host.node] = "stamping" if stamp else "unstamped"
        self.now += 1.0  # a start waits for the publisher to answer
        self.frozen.pop(host.node, None)

    def stop_control_plane(self) -> None:
        self.operations.append("stop_control_plane")
        self.control_plane = False
        if "holder_exits" in self.broken:
            self.dead.add(self.replicas[0].name)
        elif "no_leader" not in self.broken:
            self.logs["replica-0"] += "lease sandbox-system/driver: r0_1_abc could not renew "
            self.logs["replica-0"] += "within 3s; it stops leading and campaigns again in 5s\n"

    def start_control_plane(self) -> None:
        self.operations.append("start_control_plane")
        self.control_plane = True

    def kill_host(self, host: Host) -> None:
        raise AssertionError("no sandbox lane kills a host")

    def start_host(self, host: Host) -> None:
        raise AssertionError("no sandbox lane starts a host")

    def replica_log(self, replica: Replica) -> str:
        return self.logs[replica.name]

    def packets_to_agent(self, host: Host) -> int:
        return 0

    def heal(self, progress: object) -> None:
        return None

    def describe(self) -> str:
        return "a fake kit"

    # --- the answers -------------------------------------------------------------------

    def _object(self, s: Sandbox) -> dict[str, Any]:
        namespace, name = s.ref.split("/", 1)
        return {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {PHASE: s.phase},
                "annotations": {"sandbox.cocoonstack.io/claim-id": s.id},
            },
            "status": {"nodeName": s.node},
        }

    def _kube(self, replica: Replica, request: httpx.Request, closed: threading.Event) -> Any:
        if replica.name in self.dead:
            raise httpx.ConnectError("connection refused", request=request)
        path, query = request.url.path, parse_qs(request.url.query.decode())
        if path == "/healthz":
            return httpx.Response(200, text="ok")
        objects = self.by_name()
        if path == SANDBOXES and query.get("watch") == ["true"]:
            return httpx.Response(200, content=self._watch(list(objects.values()), closed))
        if path == SANDBOXES:
            items = [self._object(s) for s in objects.values()]
            return httpx.Response(200, json={"items": items})
        if path == NAMESPACED:
            name = query["fieldSelector"][0].removeprefix("metadata.name=")
            phase = query["labelSelector"][0].removeprefix(f"{PHASE}=")
            pick = objects.get(f"default/{name}")
            items = [pick] if pick is not None and pick.phase == phase else []
            if not items and "pinned_fallback" in self.broken:
                items = [
                    s for s in self.visible() if s.ref == f"default/{name}" and s.phase == phase
                ][:1]
            return httpx.Response(200, json={"items": [self._object(s) for s in items]})
        if path.startswith(NAMESPACED + "/"):
            found = objects.get("default/" + path.rsplit("/", 1)[1])
            if found is None:
                return httpx.Response(404, json={})
            return httpx.Response(200, json=self._object(found))
        return httpx.Response(404, json={})

    def _watch(self, opening: list[Sandbox], closed: threading.Event) -> Iterator[bytes]:
        handed = [len(self.events)]
        self.streams.append(handed)
        for s in opening:
            yield (json.dumps({"type": "ADDED", "object": self._object(s)}) + "\n").encode()
        end = {"metadata": {"annotations": {"k8s.io/initial-events-end": "true"}}}
        yield (json.dumps({"type": "BOOKMARK", "object": end}) + "\n").encode()
        deadline = time.monotonic() + 30
        while not closed.is_set() and time.monotonic() < deadline:
            if handed[0] < len(self.events):
                line = self.events[handed[0]]
                yield line.encode()
                handed[0] += 1  # the reader asked for more: it has the line
            else:
                time.sleep(0.002)

    def _event(self, kind: str, s: Sandbox) -> None:
        self.events.append(json.dumps({"type": kind, "object": self._object(s)}) + "\n")

    def _deliver(self) -> None:
        """Until every open watch has handed its reader the events so far."""
        deadline = time.monotonic() + 5
        while any(h[0] < len(self.events) for h in self.streams):
            if time.monotonic() > deadline:
                raise AssertionError("a fake watch did not take its events")
            time.sleep(0.002)

    def _e2b(self, replica: Replica, request: httpx.Request) -> httpx.Response:
        if replica.name in self.dead:
            raise httpx.ConnectError("connection refused", request=request)
        path = request.url.path
        if path == "/health":
            return httpx.Response(204)
        if path == "/sandboxes" and request.method == "GET":
            return httpx.Response(
                200,
                json=[
                    {
                        "sandboxID": s.id,
                        "clientID": s.node,
                        "state": "paused" if s.phase == "Hibernated" else "running",
                    }
                    for s in self.visible()
                ],
            )
        if path == "/sandboxes" and request.method == "POST":
            node = next(self._placement)
            s = self._claim(node, f"default/e2b-{len(self.sandboxes)}")
            return httpx.Response(201, json={"sandboxID": s.id, "clientID": node})
        found = self.sandboxes.get(path.rsplit("/", 1)[1])
        if found is None:
            return httpx.Response(404, json={"message": "sandbox not found"})
        self.asked[found.node] += 1
        if request.method == "GET" and "asks_other" in self.broken:
            other = self.a.node if found.node == self.b.node else self.b.node
            self.asked[other] += 1
        if request.method == "DELETE":
            del self.sandboxes[found.id]
            return httpx.Response(204)
        return httpx.Response(200, json={"sandboxID": found.id, "clientID": found.node})

    def _claim(self, node: str, ref: str) -> Sandbox:
        s = Sandbox(f"sb-{next(self._ids):04d}", node, ref)
        self.sandboxes[s.id] = s
        return s

    def _agent(self, host: Host, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/claim":
            s = self._claim(host.node, json.loads(request.content)["claim_ref"])
            return httpx.Response(200, json={"id": s.id, "token": "t-" + s.id})
        if path == "/metrics":
            count = self.asked[host.node]
            text = (
                "# TYPE sandboxd_requests_total counter\n"
                f'sandboxd_requests_total{{route="/v1/sandboxes/{{sandbox_id}}",'
                f'method="GET",status="200"}} {count}\n'
                'sandboxd_requests_total{route="/v1/sandboxes",method="GET",status="200"} 99\n'
            )
            return httpx.Response(200, text=text)
        sandbox_id = path.split("/")[3]
        found = self.sandboxes.get(sandbox_id)
        if found is None or found.node != host.node:
            return httpx.Response(404, json={"error": "no such sandbox"})
        if path.endswith("/release"):
            del self.sandboxes[sandbox_id]
        elif path.endswith("/hibernate"):
            found.phase = "Hibernated"
        return httpx.Response(204)

"""A fleet on Kubernetes, every part a real process on loopback: the real control plane
(the shared one of tests/testing/realkube.py, whose kube-apiserver or etcd a test may
stop and start again: a control-plane outage), host agents (``serve-sandboxd``), one
publisher per host (``publish``), API servers (``serve-apiserver --source kube``) and an
envd proxy (``serve-proxy --source kube``). Each part talks to kube-apiserver as its own
service account, with only the rights ``manifests/base/rbac-*.yaml`` give it
(tests/fleet/kube/identities.py).

Windows are compressed: hosts publish every ``INTERVAL`` and readers drop a node whose
publish trails the newest by more than ``STALE_AFTER``.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandboxctl.agentapi import AgentClient, ClaimGrant, ClaimRequest
from sandboxctl.apiserver.e2b.models import envd_access_token
from sandboxctl.core.ids import SandboxId
from sandboxctl_testing.controlplane import ControlPlane
from tests.fleet.kube.identities import Identities, grant_manifest_rights
from tests.sandboxd.servers import free_port, sandboxes_unavailable, status_of, wait_until
from tests.testing.realkube import RealKube

ROOT_TOKEN = "fleet-root-token"
KUBE_TOKEN = "sandbox-api-token"
E2B_KEY = "e2b_" + "k" * 40
SECRET = "envd-secret-for-kube-fleet"
DOMAIN = "sandboxes.test"
INTERVAL = 1.0
STALE_AFTER = 4.0
NI = "/apis/sandbox.cocoonstack.io/v1beta1/nodeinventories"
SANDBOXES = "apis/agents.x-k8s.io/v1beta1/namespaces/default/sandboxes"


def skip_reason() -> str | None:
    return sandboxes_unavailable()


class Process:
    """``python -m sandboxctl ARGS``, its output in a file (read back on failure)."""

    def __init__(self, name: str, args: list[str], ready_url: str, workdir: Path) -> None:
        self.name = name
        self.args = args
        self.ready_url = ready_url
        self.log = workdir / f"{name}.log"
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        return self.spawn().ready()

    def spawn(self) -> Process:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "sandboxctl", *self.args],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return self

    def ready(self) -> Process:
        popen = self.popen
        assert popen is not None
        try:
            wait_until(
                lambda: (status_of(self.ready_url) or 500) < 500 or popen.poll() is not None,
                timeout=60,
                what=f"{self.name} to answer",
            )
        except AssertionError:
            raise AssertionError(f"{self.name} did not answer: {self.output()}") from None
        if popen.poll() is not None:
            raise AssertionError(f"{self.name} exited with {popen.returncode}: {self.output()}")
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.signal(sig)
        self.stopped()

    def signal(self, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` if it runs; ``stopped`` waits for it to end."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(sig)

    def stopped(self) -> bool:
        """Wait for it to end; one still running after 30 s is killed (False)."""
        ended = True
        if self.popen is not None:
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
                ended = False
        self.popen = None
        return ended

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


@dataclass
class Node:
    name: str
    address: str
    agent: Process
    publisher: Process
    metrics_port: int


@dataclass
class KubeFleet:
    workdir: Path
    plane: ControlPlane
    identities: Identities
    nodes: dict[str, Node] = field(default_factory=dict)
    apiservers: list[tuple[Process, str, str]] = field(default_factory=list)  # (process, kube, e2b)
    proxies: list[tuple[Process, str]] = field(default_factory=list)
    uid_base: int = 0

    # --- parts ----------------------------------------------------------------------------

    def files(self) -> dict[str, Path]:
        out = {
            "root": self.workdir / "root.token",
            "kube": self.workdir / "kube.tokens",
            "e2b": self.workdir / "e2b.keys",
            "secret": self.workdir / "envd.secret",
        }
        if not out["root"].exists():
            out["root"].write_text(ROOT_TOKEN)
            out["kube"].write_text(f"{KUBE_TOKEN} *\n")
            out["e2b"].write_text(f"{E2B_KEY} default\n")
            out["secret"].write_text(SECRET)
        return out

    def add_node(self, name: str, pool: int = 1, publish_args: tuple[str, ...] = ()) -> Node:
        files = self.files()
        port = free_port()
        address = f"127.0.0.1:{port}"
        state = self.workdir / f"agent-{name}"
        state.mkdir(mode=0o711)
        offset = 40 * len(self.nodes)
        agent = Process(
            f"agent-{name}",
            [
                "serve-sandboxd",
                "--node",
                name,
                "--listen",
                address,
                "--state-dir",
                str(state),
                "--token-file",
                str(files["root"]),
                "--pool",
                f"base={pool}",
                "--max-sandboxes",
                "8",
                "--uid-base",
                str(self.uid_base + offset),
                "--destroy-on-exit",
            ],
            f"http://{address}/metrics",
            self.workdir,
        ).spawn()
        metrics = free_port()
        publisher = self.publisher(name, address, metrics, *publish_args).spawn()
        node = Node(name, address, agent, publisher, metrics)
        self.nodes[name] = node
        return node

    def publisher(self, name: str, address: str, metrics_port: int, *extra: str) -> Process:
        return Process(
            f"publish-{name}",
            [
                "publish",
                "--node",
                name,
                "--sandboxd",
                f"http://{address}",
                "--sandboxd-token-file",
                str(self.files()["root"]),
                "--kubeconfig",
                str(self.identities.publisher),
                "--interval",
                f"{INTERVAL}s",
                "--metrics-listen",
                f"127.0.0.1:{metrics_port}",
                *extra,
            ],
            f"http://127.0.0.1:{metrics_port}/metrics",
            self.workdir,
        )

    def restart_publisher(self, name: str, *extra: str) -> None:
        node = self.nodes[name]
        node.publisher.stop()
        node.publisher = self.publisher(name, node.address, node.metrics_port, *extra).start()

    def add_apiserver(self, *extra: str) -> tuple[str, str]:
        files = self.files()
        kube, e2b = free_port(), free_port()
        process = Process(
            f"apiserver-{len(self.apiservers)}",
            [
                "serve-apiserver",
                "--source",
                "kube",
                "--kubeconfig",
                str(self.identities.apiserver),
                "--sandboxd-token-file",
                str(files["root"]),
                "--kube-token-file",
                str(files["kube"]),
                "--listen",
                f"127.0.0.1:{kube}",
                "--e2b-listen",
                f"127.0.0.1:{e2b}",
                "--e2b-api-key-file",
                str(files["e2b"]),
                "--e2b-domain",
                DOMAIN,
                "--e2b-envd-secret-file",
                str(files["secret"]),
                "--inventory-stale-after",
                f"{STALE_AFTER}s",
                "--publish-interval",
                f"{INTERVAL}s",
                *extra,
            ],
            f"http://127.0.0.1:{kube}/healthz",
            self.workdir,
        ).spawn()
        urls = (f"http://127.0.0.1:{kube}", f"http://127.0.0.1:{e2b}")
        self.apiservers.append((process, *urls))
        return urls

    def add_proxy(self, *extra: str) -> str:
        files = self.files()
        port = free_port()
        process = Process(
            f"proxy-{len(self.proxies)}",
            [
                "serve-proxy",
                "--source",
                "kube",
                "--kubeconfig",
                str(self.identities.proxy),
                "--sandboxd-token-file",
                str(files["root"]),
                "--domain",
                DOMAIN,
                "--e2b-envd-secret-file",
                str(files["secret"]),
                "--listen",
                f"127.0.0.1:{port}",
                "--inventory-stale-after",
                f"{STALE_AFTER}s",
                "--publish-interval",
                f"{INTERVAL}s",
                *extra,
            ],
            f"http://127.0.0.1:{port}/healthz",
            self.workdir,
        ).spawn()
        url = f"http://127.0.0.1:{port}"
        self.proxies.append((process, url))
        return url

    def ready(self) -> None:
        """Wait for every part added since the last call (they start side by side)."""
        for part in self.parts():
            part.ready()

    def parts(self) -> list[Process]:
        out: list[Process] = []
        for node in self.nodes.values():
            out += [node.agent, node.publisher]
        out += [p for p, *_ in self.apiservers]
        out += [p for p, _ in self.proxies]
        return out

    # --- reads ----------------------------------------------------------------------------

    def inventory(self, name: str) -> dict[str, Any] | None:
        """The NodeInventory object as the admin reads it (None while there is none)."""
        with self.plane.http() as http:
            answer = http.get(f"{NI}/{name}")
        return answer.json() if answer.status_code == 200 else None

    def claim_on(self, name: str, claim_ref: str) -> ClaimGrant:
        """A claim made on one node's agent directly (placement is random otherwise)."""
        with AgentClient(self.nodes[name].address, ROOT_TOKEN) as agent:
            return agent.claim(ClaimRequest(template="base", claim_ref=claim_ref, ttl_seconds=600))

    def listed(self, kube_url: str) -> set[str]:
        answer = httpx.get(f"{kube_url}/{SANDBOXES}", headers=kube_auth(), timeout=5)
        answer.raise_for_status()
        return {item["metadata"]["name"] for item in answer.json()["items"]}

    def e2b_status(self, e2b_url: str, grant: ClaimGrant) -> int:
        answer = httpx.get(
            f"{e2b_url}/sandboxes/{SandboxId.of_claim(grant.id).public}",
            headers={"X-API-Key": E2B_KEY},
            timeout=5,
        )
        return answer.status_code

    def proxy_status(self, proxy_url: str, grant: ClaimGrant) -> int:
        host = f"49983-{SandboxId.of_claim(grant.id).public}.{DOMAIN}"
        headers = {"Host": host, "X-Access-Token": envd_access_token(SECRET.encode(), grant.token)}
        return httpx.get(f"{proxy_url}/health", headers=headers, timeout=5).status_code


def kube_auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KUBE_TOKEN}"}


@pytest.fixture
def kube_fleet(uid_base: int, kube: RealKube) -> Iterator[KubeFleet]:
    """A fleet on the shared control plane. Its parts stop before the plane is reset
    (this fixture ends first), so nothing they write outlives the test; a test that
    stopped kube-apiserver or etcd has them back before the reset reads the plane."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    workdir = Path(tempfile.mkdtemp(prefix="sandboxctl-kubefleet-", dir="/tmp"))
    workdir.chmod(0o711)
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        fleet = KubeFleet(workdir, kube.plane, grant_manifest_rights(kube.plane), uid_base=uid_base)
        stack.callback(_stop_all, fleet)
        yield fleet


def _stop_all(fleet: KubeFleet) -> None:
    # Side by side: each part's graceful stop (an agent destroying its sandboxes) takes
    # seconds, and none waits for another.
    parts = list(reversed(fleet.parts()))
    for part in parts:
        part.signal()
    killed = [part for part in parts if not part.stopped()]
    if killed:  # what it left behind is the uid check's; say why it was left
        raise AssertionError(
            "\n".join(f"{part.name} did not stop within 30 s: {part.output()}" for part in killed)
        )


class Watch:
    """A Sandbox API watch read on a thread: (monotonic time, type, name) per event."""

    def __init__(self, kube_url: str) -> None:
        import threading

        self.events: list[tuple[float, str, str]] = []
        self._stream = httpx.stream(
            "GET",
            f"{kube_url}/{SANDBOXES}?watch=1&timeoutSeconds=120",
            headers=kube_auth(),
            timeout=130,
        )
        self._response = self._stream.__enter__()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for line in self._response.iter_lines():
                if line:
                    event = json.loads(line)
                    name = event["object"].get("metadata", {}).get("name", "")
                    self.events.append((time.monotonic(), event["type"], name))
        except httpx.HTTPError:
            return

    def first(self, kind: str, name: str) -> float | None:
        return next((t for t, k, n in self.events if (k, n) == (kind, name)), None)

    def close(self) -> None:
        self._stream.__exit__(None, None, None)


def first_times(checks: dict[str, Callable[[], bool]], timeout: float) -> dict[str, float]:
    """The monotonic time each check first holds, all polled together every 50 ms."""
    found: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(found) < len(checks):
        for name, check in checks.items():
            if name not in found and check():
                found[name] = time.monotonic()
        if time.monotonic() > deadline:
            missing = sorted(set(checks) - set(found))
            raise AssertionError(f"timed out after {timeout}s waiting for {missing}")
        time.sleep(0.05)
    return found

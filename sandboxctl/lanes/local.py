"""The local kit: the K1 kit on this machine, built fresh for a run.

Two hosts A and B are network namespaces on a bridge in the root namespace, with
addresses of a free /28 of 203.0.113.0/24 (no default route inside them). Each runs its
agent (``serve-sandboxd``) and its publisher (``publish``). The control plane is a real
one (etcd and kube-apiserver, ``python -m sandboxctl_testing.controlplane``) with
kube-apiserver on the bridge address, the project's CRDs and the RBAC of
``manifests/base``: every part has its own service account's rights, no more. Without the
tools ``make kube-tools`` builds, the kit says so in one line and runs the Kubernetes API
double (``python -m sandboxctl_testing.kubeapi``) there instead. Either is a process of
its own, so that K1OUT can stop kube-apiserver (or the double) and etcd. Two API server
replicas (replica 0 runs the warm-pool driver and holds its Lease) and the envd proxy run
in the root namespace. A SandboxWarmPool of 4 keeps two warm sandboxes on each host.
Windows are scaled down (publish 3 s, stale 9 s). Packets toward B's agent are counted
by an nftables counter in B's namespace, so a dead agent's are counted too.

Everything (processes, namespaces, links, the state directory) goes on exit, on Ctrl-C
and on failure, unless the run keeps it (``--keep``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import itertools
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx

import sandboxctl
from sandboxctl.agentapi import AgentClient, ClaimRequest
from sandboxctl.apiserver.kubeconfig import write_kubeconfig
from sandboxctl.core.names import SANDBOX_TEMPLATES, SANDBOX_WARM_POOLS
from sandboxctl.lanes import hostnet, observe
from sandboxctl.lanes.guardkit import KARPENTER_CRDS
from sandboxctl.lanes.kit import Host, Replica
from sandboxctl.lanes.model import LOCAL, KitDown, LaneError, Progress, Windows
from sandboxctl.lanes.processes import Process, first_error, free_port, run, start_all, stop_all
from sandboxctl.sandboxd.procfs import pids_of_uids
from sandboxctl.sandboxd.runtimedir import (
    DEFAULT_RUNTIME_ROOT,
    RUNTIME_ROOT_ENV,
    UIDS,
    runtime_dir,
)
from sandboxctl.sandboxd.uids import UidClaims

WINDOWS = Windows(publish=3.0, stale_after=9.0)
TEST_NET = ipaddress.IPv4Network("203.0.113.0/24")
AGENT_PORT = 27777  # inside each host's namespace, so every host has the same
PUBLISHER_METRICS_PORT = 9100
NAMESPACE = "default"
WARM_POOL = "base"
WARM_POOL_SIZE = 4
LEASE_NAMESPACE = "sandbox-system"
DOMAIN = "sandboxes.lanes.test"
MAX_SANDBOXES = 64  # K1A alone claims 7 + 30 + 30 at its peak, over two hosts
UID_SPAN = 100  # uids per agent, above MAX_SANDBOXES
TABLE = "lanes_count"  # not sandboxctl_*: the agent removes such tables it does not own
COUNTER = "to_agent"
REPO = Path(sandboxctl.__file__).resolve().parents[1]
CRDS = REPO / "manifests" / "crds"  # the guard lanes register Karpenter's through the API
BASE = REPO / "manifests" / "base"
EXT = f"apis/{SANDBOX_WARM_POOLS.api_version}/namespaces/{NAMESPACE}"
SENTINEL = "lanes-sentinel"  # one long-lived sandbox per host: heal's view of freshness
SENTINEL_TTL = 3600
HEAL_START = 60.0  # seconds for parts to answer after a (re)start
# The control plane: the real one or the Kubernetes API double, each run as a process
# (sandboxctl never imports them); they ship apart from sandboxctl, in the repository's
# testing/ distribution, which the [lanes] extra names.
PLANE = "sandboxctl_testing.controlplane"
DOUBLE = "sandboxctl_testing.kubeapi"
DOUBLE_NAME = "the Kubernetes API double"
PLANE_START = 120.0  # seconds: etcd and kube-apiserver each get 60 (a busy machine)
PLANE_STOP = 60.0  # seconds for the plane to stop its parts (20 s each at most)
PLANE_ACTION = 90.0  # seconds for a part of it to stop or start again
# Each part's kubeconfig names the service account manifests/base gives it rights for.
SERVICE_ACCOUNTS = {
    "publisher": "sandboxctl-publisher",
    "apiserver": "sandboxctl-apiserver",
    "proxy": "sandboxctl-proxy",
}
RBAC = ("namespace.yaml", "rbac-publisher.yaml", "rbac-apiserver.yaml", "rbac-proxy.yaml")
_built = itertools.count()


@dataclass
class LocalHost:
    host: Host
    netns: str
    link: str
    address: str
    state_dir: Path
    agent: Process
    publisher: Process
    stamping: bool = True


@dataclass
class Credentials:
    root_token: str
    kube_token: str
    e2b_key: str
    envd_secret: str
    files: dict[str, Path] = field(default_factory=dict)

    @classmethod
    def write(cls, directory: Path) -> Credentials:
        made = cls(
            root_token=secrets.token_hex(16),
            kube_token=secrets.token_hex(16),
            e2b_key="e2b_" + secrets.token_hex(20),
            envd_secret=secrets.token_hex(16),
        )
        contents = {
            "root": made.root_token,
            "kube": f"{made.kube_token} *\n",
            "e2b": f"{made.e2b_key} {NAMESPACE}\n",
            "envd": made.envd_secret,
        }
        for name, text in contents.items():
            path = directory / f"{name}.secret"
            path.write_text(text)
            path.chmod(0o600)
            made.files[name] = path
        return made


class LocalKit:
    """The kit as :class:`sandboxctl.lanes.kit.Kit` describes it; built by :func:`local_kit`."""

    name = LOCAL
    windows = WINDOWS
    domain = DOMAIN
    warm_pool = f"{NAMESPACE}/{WARM_POOL}"
    template = "base"

    def __init__(self, workdir: Path, uid_base: int, real: bool = True) -> None:
        self.workdir = workdir
        self.real = real  # the real control plane; False: the Kubernetes API double
        self.plane_dir = workdir / "controlplane"
        self.control_plane_name = "the real control plane" if real else DOUBLE_NAME
        self._plane_facts: dict[str, Any] = {}  # plane.json, once the real plane is up
        self.logs = workdir / "logs"
        self.logs.mkdir()
        self.uid_base = uid_base
        self.credentials = Credentials.write(workdir)
        # Unique per kit on this machine: the pid, and a count for kits of one process.
        tag = f"{os.getpid() % 100000:05d}{next(_built) % 10}"
        self.bridge = f"lnbr{tag}"
        block = hostnet.free_test_block(TEST_NET, 28, "the local kit's hosts")
        addresses = [str(address) for address in block.hosts()]
        self.prefix = block.prefixlen
        self.gateway = addresses[0]
        self.double_port = 0  # picked once the bridge carries the gateway address
        self.control_port = 0  # the real plane's control endpoint, on loopback
        self.kubeconfig = self.plane_dir / "admin.kubeconfig" if real else workdir / "kubeconfig"
        self.hosts: dict[str, LocalHost] = {}
        for label, address in zip(("A", "B"), addresses[1:3], strict=True):
            self.hosts[label] = self._host(label, tag, address)
        self._net = hostnet.HostNet(
            block,
            self.gateway,
            tuple(
                hostnet.NamespaceHost(local.netns, local.link, (local.address,))
                for local in self.hosts.values()
            ),
            bridge=self.bridge,
        )
        self.a: Host = self.hosts["A"].host  # stays up
        self.b: Host = self.hosts["B"].host  # the faults hit it
        self.plane: Process | None = None  # the real plane's process, or the double
        self.replica_parts: list[Process] = []
        self.replicas: tuple[Replica, ...] = ()
        self.proxy_part: Process | None = None
        self.proxy_url = ""
        self._network_up = False

    # --- the protocol's attributes -------------------------------------------------------

    @property
    def envd_secret(self) -> bytes:
        """The envd secret the proxy checks access tokens against (e2b's scheme)."""
        return self.credentials.envd_secret.encode()

    # --- clients -------------------------------------------------------------------------

    def e2b(self, replica: Replica) -> httpx.Client:
        return httpx.Client(
            base_url=replica.e2b_url, headers={"X-API-Key": self.credentials.e2b_key}, timeout=15
        )

    def kube(self, replica: Replica) -> httpx.Client:
        return httpx.Client(
            base_url=replica.kube_url,
            headers={"Authorization": f"Bearer {self.credentials.kube_token}"},
            timeout=15,
        )

    def proxy(self) -> httpx.Client:
        return httpx.Client(base_url=self.proxy_url, timeout=15)

    def agent(self, host: Host) -> AgentClient:
        return AgentClient(host.agent_url, self.credentials.root_token, timeout=15)

    def control_plane(self) -> httpx.Client:
        """A client for the control plane as its admin (the double asks no credentials)."""
        if not self.real:
            return httpx.Client(base_url=self.double_base, timeout=10)
        context = ssl.create_default_context(cafile=self._plane_facts["ca"])
        context.load_cert_chain(
            self._plane_facts["admin"]["cert"], self._plane_facts["admin"]["key"]
        )
        return httpx.Client(base_url=self._plane_facts["url"], verify=context, timeout=10)

    # --- faults --------------------------------------------------------------------------

    def kill_host(self, host: Host) -> None:
        local = self._local(host)
        local.agent.kill()
        local.publisher.kill()

    def start_host(self, host: Host) -> None:
        local = self._local(host)
        if not local.publisher.running:
            local.publisher = self._publisher(local, stamp=True)
            local.stamping = True
        start_all([local.agent, local.publisher])  # side by side: the publisher retries

    def stop_publisher(self, host: Host) -> None:
        self._local(host).publisher.stop()

    def start_publisher(self, host: Host, stamp: bool = True) -> None:
        local = self._local(host)
        local.publisher.stop()
        local.publisher = self._publisher(local, stamp=stamp).start()
        local.stamping = stamp

    def stop_control_plane(self) -> None:
        """Stop kube-apiserver (etcd keeps running), or the double."""
        if self.real:
            self._plane_action("kube-apiserver", "stop")
        else:
            assert self.plane is not None
            self.plane.stop()

    def start_control_plane(self) -> None:
        if self.real:
            self._plane_action("kube-apiserver", "start")
        else:
            assert self.plane is not None
            if not self.plane.running:
                self.plane.start()

    def etcd_problem(self) -> str | None:
        return None if self.real else self._no_part("etcd")

    def stop_etcd(self) -> None:
        """Stop etcd under a running kube-apiserver (the real control plane only)."""
        self._plane_action("etcd", "stop")

    def start_etcd(self) -> None:
        """Start etcd again; returns once kube-apiserver is ready on it."""
        self._plane_action("etcd", "start")

    # --- facts ---------------------------------------------------------------------------

    def replica_log(self, replica: Replica) -> str:
        return self.replica_parts[self.replicas.index(replica)].output()

    def packets_to_agent(self, host: Host) -> int:
        local = self._local(host)
        listing = run(
            ["ip", "netns", "exec", local.netns, "nft", "-j", "list", "counter", "inet", TABLE,
             COUNTER]
        )  # fmt: skip
        for item in json.loads(listing).get("nftables", []):
            if "counter" in item:
                return int(item["counter"]["packets"])
        raise LaneError(f"no nftables counter {COUNTER} in {local.netns}")

    # --- lifecycle -----------------------------------------------------------------------

    def build(self, progress: Progress) -> None:
        """Make the network, start every part side by side, fill the pool."""
        progress.note(
            f"local kit in {self.workdir}: hosts on {self.gateway}/{self.prefix}, windows: "
            f"publish {self.windows.publish:g} s, stale after {self.windows.stale_after:g} s"
        )
        self._network()
        if self.real:
            self.plane = self._real_plane()
        else:
            write_kubeconfig(self.kubeconfig, self.double_base)
            self.plane = self._double()
        self._replicas_and_proxy()
        if self.real:
            # Every part's kubeconfig is the plane's to write: the agents start beside it,
            # the rest once it is up. Its name is what the report says it ran on.
            self.plane.spawn()
            for local in self.hosts.values():
                local.agent.spawn()
            self.plane.ready(PLANE_START)
            self._plane_facts = json.loads((self.plane_dir / "plane.json").read_text())
            self.control_plane_name = str(self._plane_facts["name"])
            progress.note(f"control plane: {self.control_plane_name} at {self._plane_facts['url']}")
        # All at once: publishers and readers retry until the control plane answers, and
        # the machine's cores, not the order, set the pace.
        for part in self._parts():
            if not part.running:
                part.spawn()
        self.plane.ready(PLANE_START)
        self._objects()
        start_all(self._parts())
        self._sentinels()
        self.heal(progress)

    def heal(self, progress: Progress) -> None:
        if self.real:
            if self.plane is None or not self.plane.running:
                # Started again it would make new certificates and ports under every part.
                tail = self.plane.tail() if self.plane is not None else "never started"
                raise LaneError(f"the control plane exited: {tail}")
            self._plane_action("etcd", "start")  # each a no-op when it is up
            self._plane_action("kube-apiserver", "start")
        elif self.plane is not None and not self.plane.running:
            self.plane.start()
        for local in self.hosts.values():
            if not local.publisher.running or not local.stamping:
                local.publisher.stop()
                local.publisher = self._publisher(local, stamp=True)
                local.stamping = True
        start_all(self._parts(), HEAL_START)
        with observe.Clients(self) as clients:  # kept across the polls
            progress.wait_for(
                "every replica to list both hosts, and the same sandboxes",
                lambda: self._settled(clients),
                observe.heal_bound(self.windows),
            )
        progress.wait_for(
            f"the warm pool to hold {WARM_POOL_SIZE}",
            lambda: observe.pool_full(self, WARM_POOL_SIZE),
            observe.POOL_FILL_SECONDS,
        )

    def describe(self) -> str:
        lines = [
            f"local kit, state and logs in {self.workdir} (logs/ has one file per part)",
            f"  control plane: {self.control_plane_name} at {self.plane_url} (kubeconfig "
            f"{self.kubeconfig})"
            + (
                f", stop or start kube-apiserver or etcd: curl -X POST {self.control_url}/"
                "{kube-apiserver,etcd}/{stop,start}"
                if self.real
                else ""
            ),
        ]
        for label, local in self.hosts.items():
            lines.append(
                f"  host {label}: node {local.host.node}, agent {local.host.agent_url}, "
                f"namespace {local.netns} (ip netns exec {local.netns} ...)"
            )
        for replica in self.replicas:
            lines.append(f"  {replica.name}: Sandbox API {replica.kube_url}, e2b {replica.e2b_url}")
        files = self.credentials.files
        lines += [
            f"  envd proxy: {self.proxy_url} (domain {self.domain})",
            f"  credentials: root token {files['root']}, Sandbox API tokens {files['kube']}, "
            f"e2b keys {files['e2b']}, envd secret {files['envd']}",
            f"  tear down: kill $(cut -d' ' -f2 {self.workdir / 'pids'}) (SIGTERM: the agents "
            "destroy their sandboxes); once they are gone: "
            + "; ".join(f"ip netns del {h.netns}" for h in self.hosts.values())
            + f"; ip link del {self.bridge}; rm -r {self.workdir}",
        ]
        (self.workdir / "pids").write_text(
            "".join(f"{part.name} {part.pid}\n" for part in self._parts() if part.pid)
        )
        return "\n".join(lines)

    def close(self) -> None:
        """Stop every part (an agent that was killed comes back first, so that it destroys
        the sandboxes it kept), then remove the namespaces, the bridge and the files."""
        for local in self.hosts.values():
            if not local.agent.running and local.state_dir.exists() and self._network_up:
                with contextlib.suppress(LaneError):
                    local.agent.start()
        parts = [part for part in self._parts() if part is not self.plane]
        actions: list[Callable[[], None]] = [partial(stop_all, parts)]
        if self.plane is not None:  # last: the agents' and publishers' last words go to it
            actions.append(partial(self.plane.stop, timeout=PLANE_STOP))
        actions.append(self._kill_sandboxes)  # what an agent that never came back left
        actions.append(self._network_down)
        error = first_error(actions)
        shutil.rmtree(self.workdir, ignore_errors=True)
        if error is not None:
            raise KitDown(f"tearing the local kit down: {error}")

    # --- building ------------------------------------------------------------------------

    @property
    def double_base(self) -> str:
        return f"http://{self.gateway}:{self.double_port}"

    @property
    def control_url(self) -> str:
        return f"http://127.0.0.1:{self.control_port}"

    @property
    def plane_url(self) -> str:
        return str(self._plane_facts.get("url", "")) if self.real else self.double_base

    def part_kubeconfig(self, part: str) -> Path:
        """The kubeconfig a part uses: its own service account's on the real plane."""
        return self.plane_dir / f"account-{part}.kubeconfig" if self.real else self.kubeconfig

    @staticmethod
    def _no_part(part: str) -> str:
        return (
            f"the local kit runs {DOUBLE_NAME}, which has no {part}: build the real control "
            "plane's tools with `make kube-tools` (see docs/kubernetes.md)"
        )

    def _plane_action(self, part: str, verb: str) -> None:
        if not self.real:
            raise LaneError(self._no_part(part))
        try:
            answer = httpx.post(f"{self.control_url}/{part}/{verb}", timeout=PLANE_ACTION)
        except httpx.HTTPError as error:
            raise LaneError(f"the control plane did not {verb} {part}: {error}") from None
        if answer.status_code != 200:
            raise LaneError(f"the control plane did not {verb} {part}: {answer.text.strip()}")

    def _local(self, host: Host) -> LocalHost:
        return self.hosts[host.label]

    def _host(self, label: str, tag: str, address: str) -> LocalHost:
        lower = label.lower()
        state_dir = self.workdir / f"agent-{lower}"
        state_dir.mkdir(mode=0o711)
        netns = f"lanes{tag}{lower}"
        host = Host(label, f"lanes-{lower}", f"http://{address}:{AGENT_PORT}")
        offset = UID_SPAN * (ord(lower) - ord("a"))
        agent = Process(
            f"agent-{lower}",
            [
                "serve-sandboxd",
                "--node", host.node,
                "--listen", f"{address}:{AGENT_PORT}",
                "--state-dir", str(state_dir),
                "--token-file", str(self.credentials.files["root"]),
                "--max-sandboxes", str(MAX_SANDBOXES),
                "--uid-base", str(self.uid_base + offset),
                "--sandbox-dns", "none",
                "--destroy-on-exit",
            ],
            f"{host.agent_url}/metrics",
            self.logs,
            netns=netns,
        )  # fmt: skip
        local = LocalHost(host, netns, f"ln{tag}{lower}", address, state_dir, agent, agent)
        local.publisher = self._publisher(local, stamp=True)
        return local

    def _publisher(self, local: LocalHost, stamp: bool) -> Process:
        metrics = f"{local.address}:{PUBLISHER_METRICS_PORT}"
        return Process(
            f"publish-{local.host.label.lower()}",
            [
                "publish",
                "--node", local.host.node,
                "--sandboxd", local.host.agent_url,
                "--sandboxd-token-file", str(self.credentials.files["root"]),
                "--kubeconfig", str(self.part_kubeconfig("publisher")),
                "--interval", f"{self.windows.publish:g}s",
                "--metrics-listen", metrics,
                *([] if stamp else ["--no-stamp"]),
            ],
            f"http://{metrics}/metrics",
            self.logs,
            netns=local.netns,
        )  # fmt: skip

    def _real_plane(self) -> Process:
        self.plane_dir.mkdir()
        self.control_port = free_port("127.0.0.1")
        accounts = [
            f"--service-account={part}={LEASE_NAMESPACE}/{account}"
            for part, account in SERVICE_ACCOUNTS.items()
        ]
        # Karpenter's CRDs too, once `make kube-tools` copied them: kube-apiserver serves
        # a CRD's objects only once it is Established, which the plane waits for and the
        # guard lanes' own registration (for the double, which serves them at once) does not.
        karpenter = [f"--crds={KARPENTER_CRDS}"] if any(KARPENTER_CRDS.glob("*.yaml")) else []
        return Process(
            "controlplane",
            [
                "--workdir", str(self.plane_dir),
                "--host", self.gateway,
                "--control", f"127.0.0.1:{self.control_port}",
                "--crds", str(CRDS),
                *karpenter,
                *(f"--apply={BASE / name}" for name in RBAC),
                "--namespace", LEASE_NAMESPACE,
                *accounts,
            ],
            f"{self.control_url}/healthz",
            self.logs,
            module=PLANE,
        )  # fmt: skip

    def _double(self) -> Process:
        return Process(
            "kubeapi",
            [
                "--host", self.gateway,
                "--port", str(self.double_port),
                "--state", str(self.workdir / "kubeapi-state.json"),
                "--crds", str(CRDS),
                "--bookmark-interval", "0.2",
            ],
            f"{self.double_base}/healthz",
            self.logs,
            module=DOUBLE,
        )  # fmt: skip

    def _replicas_and_proxy(self) -> None:
        files = self.credentials.files
        windows = [
            "--inventory-stale-after", f"{self.windows.stale_after:g}s",
            "--publish-interval", f"{self.windows.publish:g}s",
        ]  # fmt: skip
        driver = [
            "--warm-pool-driver",
            "--leader-election-namespace", LEASE_NAMESPACE,
            "--leader-election-lease-duration", "4s",
            "--leader-election-renew-deadline", "3s",
            "--leader-election-retry-period", "500ms",
            "--warm-pool-sync-interval", "1s",
        ]  # fmt: skip
        replicas = []
        for index in range(2):
            kube, e2b = free_port("127.0.0.1"), free_port("127.0.0.1")
            part = Process(
                f"apiserver-{index}",
                [
                    "serve-apiserver",
                    "--source", "kube",
                    "--kubeconfig", str(self.part_kubeconfig("apiserver")),
                    "--sandboxd-token-file", str(files["root"]),
                    "--kube-token-file", str(files["kube"]),
                    "--listen", f"127.0.0.1:{kube}",
                    "--e2b-listen", f"127.0.0.1:{e2b}",
                    "--e2b-api-key-file", str(files["e2b"]),
                    "--e2b-domain", DOMAIN,
                    "--e2b-envd-secret-file", str(files["envd"]),
                    *windows,
                    *(driver if index == 0 else ["--no-warm-pool-driver"]),
                ],
                f"http://127.0.0.1:{kube}/healthz",
                self.logs,
            )  # fmt: skip
            self.replica_parts.append(part)
            replicas.append(
                Replica(f"replica-{index}", f"http://127.0.0.1:{kube}", f"http://127.0.0.1:{e2b}")
            )
        self.replicas = tuple(replicas)
        port = free_port("127.0.0.1")
        self.proxy_url = f"http://127.0.0.1:{port}"
        self.proxy_part = Process(
            "proxy",
            [
                "serve-proxy",
                "--source", "kube",
                "--kubeconfig", str(self.part_kubeconfig("proxy")),
                "--sandboxd-token-file", str(files["root"]),
                "--domain", DOMAIN,
                "--e2b-envd-secret-file", str(files["envd"]),
                "--listen", f"127.0.0.1:{port}",
                *windows,
            ],
            f"{self.proxy_url}/healthz",
            self.logs,
        )  # fmt: skip

    def _parts(self) -> list[Process]:
        parts = [self.plane] if self.plane is not None else []
        for local in self.hosts.values():
            parts += [local.agent, local.publisher]
        parts += self.replica_parts
        if self.proxy_part is not None:
            parts.append(self.proxy_part)
        return parts

    def _network(self) -> None:
        self._network_up = True  # teardown removes whatever of it was made
        hostnet.link(self._net)
        b = self.hosts["B"]
        # Counted at prerouting on B's link: whatever reaches B for its agent, alive or not.
        rules = (
            f"table inet {TABLE} {{\n"
            f"  counter {COUNTER} {{ }}\n"
            "  chain count {\n"
            "    type filter hook prerouting priority raw; policy accept;\n"
            f'    iifname "{hostnet.INSIDE}" ip daddr {b.address} tcp dport {AGENT_PORT} counter '
            f'name "{COUNTER}"\n'
            "  }\n"
            "}\n"
        )
        run(["ip", "netns", "exec", b.netns, "nft", "-f", "-"], rules)
        self.double_port = free_port(self.gateway)

    def _kill_sandboxes(self) -> None:
        """Kill the sandboxes this kit's agents still hold a uid claim for: only theirs,
        should another fleet's uids share the range."""
        root = Path(os.environ.get(RUNTIME_ROOT_ENV) or DEFAULT_RUNTIME_ROOT).resolve()
        if not (root / UIDS).is_dir():
            return
        ours = {runtime_dir(h.state_dir, root).path for h in self.hosts.values()}
        held = UidClaims(root / UIDS, holder=root)  # only read: whose claim each uid is
        uids = range(self.uid_base, self.uid_base + UID_SPAN * len(self.hosts))
        for pid, uid in pids_of_uids(uids).items():
            if held.holder_of(uid) in ours:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def _network_down(self) -> None:
        if not self._network_up:
            return
        hostnet.unlink(self._net)
        self._network_up = False

    def _objects(self) -> None:
        """The SandboxTemplate and the SandboxWarmPool the driver spreads."""
        spec = {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "base"}]}}}
        objects = {
            SANDBOX_TEMPLATES.plural: {
                "apiVersion": SANDBOX_TEMPLATES.api_version,
                "kind": SANDBOX_TEMPLATES.kind,
                "metadata": {"name": "base"},
                "spec": spec,
            },
            SANDBOX_WARM_POOLS.plural: {
                "apiVersion": SANDBOX_WARM_POOLS.api_version,
                "kind": SANDBOX_WARM_POOLS.kind,
                "metadata": {"name": WARM_POOL},
                "spec": {"replicas": WARM_POOL_SIZE, "sandboxTemplateRef": {"name": "base"}},
            },
        }
        with self.control_plane() as client:
            for plural, body in objects.items():
                answer = client.post(f"/{EXT}/{plural}", json=body)
                if answer.status_code != 201:
                    raise LaneError(f"creating the {plural} object: {answer.text[:200]}")

    def _sentinels(self) -> None:
        for label, local in self.hosts.items():
            with self.agent(local.host) as agent:
                agent.claim(
                    ClaimRequest(
                        template="base",
                        claim_ref=f"{NAMESPACE}/{SENTINEL}-{label.lower()}",
                        ttl_seconds=SENTINEL_TTL,
                    )
                )

    # --- heal's checks -------------------------------------------------------------------

    def _settled(self, clients: observe.Clients) -> bool:
        """Every replica lists both hosts, and every replica the same sandboxes: no write
        through one replica is still pending in another's view (a sandbox one created and
        another deleted), whose late event would land in the next scenario's watches."""
        both = {self.a.node, self.b.node}
        lists = []
        for replica in self.replicas:
            listed = observe.try_listed(clients, replica)
            if listed is None or not both <= set(listed.values()):
                return False
            lists.append(listed)
        return all(listed == lists[0] for listed in lists)


@contextlib.contextmanager
def local_kit(progress: Progress, keep: bool = False) -> Iterator[LocalKit]:
    """Build the local kit, yield it, tear it down (``keep``: leave it up and print how
    to reach it). SIGTERM tears it down like Ctrl-C."""
    problem = unavailable()
    if problem:
        raise KitDown(f"the local kit cannot run here: {problem}")
    missing = real_plane_missing()
    if missing:
        progress.note(f"running on {DOUBLE_NAME} ({DOUBLE}), not a real control plane: {missing}")
    workdir = Path(tempfile.mkdtemp(prefix="sandboxctl-lanes-", dir="/tmp"))
    workdir.chmod(0o711)  # sandbox uids traverse it to their homes
    try:
        # uids clear of the test suite's blocks (below 2.1M), so the lanes test can run beside them
        uid_base = 3_000_000 + (os.getpid() % 1000) * 2 * UID_SPAN
        kit = LocalKit(workdir, uid_base, real=missing is None)
    except BaseException as error:
        shutil.rmtree(workdir, ignore_errors=True)
        if isinstance(error, LaneError):
            raise KitDown(str(error)) from error
        raise
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        try:
            kit.build(progress)
        except LaneError as error:
            raise KitDown(str(error)) from error
        except Exception as error:  # an agent's or the double's answer: still one line
            raise KitDown(f"the local kit did not start: {error}") from error
        yield kit
    finally:
        # The teardown runs to its end: a second Ctrl-C or SIGTERM would orphan the parts.
        previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            if keep:
                progress.note("kept (--keep):\n" + kit.describe())
            else:
                kit.close()
        finally:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)


def unavailable() -> str | None:
    """Why the local kit cannot run on this machine, or None."""
    if os.geteuid() != 0:
        return "it needs root (network namespaces, sandboxes)"
    missing = [
        tool for tool in ("ip", "nft", "bwrap", "setpriv", "nsenter") if not shutil.which(tool)
    ]
    if missing:
        return f"missing {', '.join(missing)}"
    if importlib.util.find_spec(DOUBLE.partition(".")[0]) is None:
        return (
            "the control plane's runner and the Kubernetes API double are not installed: "
            "pip install -e ./testing from a checkout (sandboxctl's [lanes] extra)"
        )
    return None


def real_plane_missing() -> str | None:
    """Why the real control plane cannot run here (its programs are not built: the line
    says how to build them), or None."""
    check = subprocess.run(
        [sys.executable, "-m", PLANE, "--check-tools"], capture_output=True, text=True, check=False
    )
    if check.returncode == 0:
        return None
    return " ".join((check.stdout or check.stderr).split()) or f"exit {check.returncode}"


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt

"""One control plane's processes: etcd, kube-apiserver, and on request kube-scheduler,
kube-controller-manager and kwok, each a child with its log under ``DIR/logs``."""

from __future__ import annotations

import base64
import contextlib
import json
import re
import signal
import ssl
import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import yaml
from kubernetes import client

from sandboxctl.kube.resources import has_condition
from sandboxctl.lanes.processes import Process, first_error, free_port
from sandboxctl_testing.controlplane.pki import Authority, Pair, service_account_keys
from sandboxctl_testing.controlplane.tools import MissingTools, Tools

HOST = "127.0.0.1"
SERVICE_RANGE = "10.96.0.0/24"
READY_TIMEOUT = 60.0  # per part; a busy 2-core machine starts kube-apiserver in 5-10 s
ESTABLISHED_TIMEOUT = 30.0
ADMIN = "sandboxctl-admin"
MANAGER = "sandboxctl-test"  # the field manager of what the plane applies itself
CRD_KIND = "CustomResourceDefinition"
CLIENTS = "clients"  # the directory of client certificates under pki/
CRDS_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
FAKE_NODE = "kwok.x-k8s.io/node"  # kwok manages the nodes with this annotation set to "fake"


class ControlPlane:
    """A Kubernetes control plane on loopback, in ``workdir``.

    ``start()`` returns once kube-apiserver's ``/readyz`` answers 200, every CRD in ``crds``
    is Established, and (with ``kwok``) the first fake node is Ready. The admin kubeconfig
    (``kubeconfig``) carries a client certificate in ``system:masters``; ``kubeconfig_for``
    makes one for any user and groups, which RBAC then judges. The aggregation layer is on:
    kube-apiserver shows ``front_proxy_client`` (signed by ``front_proxy_ca``) to aggregated
    API servers. ``watch_cache=False`` serves watches from etcd, so that ``compact()`` expires
    old ones. ``stop_apiserver``/``start_apiserver`` and ``stop_etcd``/``start_etcd`` make
    an outage and end it on the same ports and data. kube-apiserver listens on ``host``
    (loopback unless another address, such as a test bridge's, must reach it); the other
    parts stay on loopback."""

    def __init__(
        self,
        workdir: Path,
        *,
        host: str = HOST,
        crds: Iterable[Path] = (),
        scheduler: bool = False,
        controller_manager: bool = False,
        kwok: bool = False,
        watch_cache: bool = True,
        tools: Tools | None = None,
    ) -> None:
        self.workdir = workdir
        self.crd_dirs = list(crds)
        self.watch_cache = watch_cache
        self.tools = tools or Tools.find()
        self.logs = workdir / "logs"
        self.certs = workdir / "pki"
        for directory in (self.logs, self.certs, self.certs / CLIENTS):
            directory.mkdir(parents=True, exist_ok=True)
        self.host = host
        self.port = free_port(host)
        self.url = f"https://{host}:{self.port}"
        self._make_pki()
        self.kubeconfig = self.kubeconfig_for(ADMIN, ["system:masters"], name="admin")
        self.etcd = self._etcd()
        self.apiserver = self._apiserver()
        self.extras: list[Process] = []
        if scheduler:
            self.extras.append(self._scheduler())
        if controller_manager:
            self.extras.append(self._controller_manager())
        self.kwok = self._kwok() if kwok else None
        if self.kwok is not None:
            self.extras.append(self.kwok)

    # --- certificates and kubeconfigs ------------------------------------------------------

    def _make_pki(self) -> None:
        self.ca = Authority(self.certs, "ca")
        self.front_proxy_ca = Authority(self.certs, "front-proxy-ca")
        self.serving = self.ca.issue(
            "apiserver", "kube-apiserver",
            hosts=dict.fromkeys([self.host, HOST, "localhost", "kubernetes", "kubernetes.default",
                                 "kubernetes.default.svc", "10.96.0.1"]),
        )  # fmt: skip
        self.front_proxy_client = self.front_proxy_ca.issue(
            "front-proxy-client", "front-proxy-client"
        )
        self.service_accounts = service_account_keys(self.certs)

    def kubeconfig_for(
        self, user: str, groups: Iterable[str] = (), *, name: str | None = None
    ) -> Path:
        """A kubeconfig whose client certificate names ``user`` in ``groups``. (Client
        certificates live apart from the plane's own, so no user's name can replace one.)"""
        # Every character but letters, digits, '.', '_' and '-' spelt out, so that two users
        # never share a file (system:a and system-a would, with ':' read as '-').
        filename = name or "user-" + re.sub(r"[^\w.-]", lambda c: f"%{ord(c[0]):02x}", user)
        pair = self.ca.issue(f"{CLIENTS}/{filename}", user, organizations=groups)
        return self.write_kubeconfig(self.workdir / f"{filename}.kubeconfig", pair)

    def write_kubeconfig(self, path: Path, pair: Pair, namespace: str = "default") -> Path:
        cert, key = pair.pem()
        document = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "sandboxctl-test",
                    "cluster": {
                        "server": self.url,
                        "certificate-authority-data": _b64(self.ca.cert.read_bytes()),
                    },
                }
            ],
            "users": [
                {
                    "name": "user",
                    "user": {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)},
                }
            ],
            "contexts": [
                {
                    "name": "sandboxctl-test",
                    "context": {
                        "cluster": "sandboxctl-test",
                        "user": "user",
                        "namespace": namespace,
                    },
                }
            ],
            "current-context": "sandboxctl-test",
        }
        path.write_text(yaml.safe_dump(document), encoding="utf-8")
        path.chmod(0o600)
        return path

    def http(self, kubeconfig_pair: Pair | None = None) -> httpx.Client:
        """An httpx client to kube-apiserver as the admin (or the pair given)."""
        pair = kubeconfig_pair or self.admin_pair
        return httpx.Client(
            base_url=self.url,
            verify=_context(self.ca.cert, pair),
            timeout=10,
        )

    @property
    def admin_pair(self) -> Pair:
        return Pair(self.certs / CLIENTS / "admin.crt", self.certs / CLIENTS / "admin.key")

    def api(self) -> client.ApiClient:
        """An official client as the admin."""
        configuration = client.Configuration()
        configuration.host = self.url
        configuration.ssl_ca_cert = str(self.ca.cert)
        configuration.cert_file = str(self.admin_pair.cert)
        configuration.key_file = str(self.admin_pair.key)
        return client.ApiClient(configuration)

    # --- the parts ---------------------------------------------------------------------------

    def _part(self, name: str, args: list[str], ready: Any) -> Process:
        return Process(name, args, "", self.logs, program=self.tools.path(name), ready_check=ready)

    def _etcd(self) -> Process:
        self.etcd_port, peer = free_port(), free_port()
        self.etcd_url = f"http://{HOST}:{self.etcd_port}"
        peer_url = f"http://{HOST}:{peer}"
        args = [
            "--name=default",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}",
            "--unsafe-no-fsync=true",  # a test's data need not survive a power cut
            "--log-level=warn",
        ]
        return self._part("etcd", args, lambda: _etcd_healthy(self.etcd_url))

    def _apiserver(self) -> Process:
        args = [
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={self.host}",
            f"--advertise-address={self.host}",
            f"--secure-port={self.port}",
            f"--tls-cert-file={self.serving.cert}",
            f"--tls-private-key-file={self.serving.key}",
            f"--client-ca-file={self.ca.cert}",
            f"--service-cluster-ip-range={SERVICE_RANGE}",
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
            # No kubelet mounts tokens here; without the controller-manager no namespace
            # has a default service account for the admission plugin to require. And a new
            # node is tainted not-ready until the node-lifecycle controller lifts it, which
            # does not run here (it would taint kwok's nodes between heartbeats): the taint
            # would stay, and no pod would be scheduled on a fake node.
            "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
            f"--service-account-issuer={self.url}",
            f"--service-account-key-file={self.service_accounts.cert}",
            f"--service-account-signing-key-file={self.service_accounts.key}",
            f"--requestheader-client-ca-file={self.front_proxy_ca.cert}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={self.front_proxy_client.cert}",
            f"--proxy-client-key-file={self.front_proxy_client.key}",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            # Without its watch cache kube-apiserver serves watches from etcd itself, so a
            # watch from before an etcd compaction is 410 Gone at once (a test's only way to
            # that answer; with the cache, it is the cache's window that ends a watch).
            f"--watch-cache={'true' if self.watch_cache else 'false'}",
            "--v=1",
        ]
        return self._part("kube-apiserver", args, self._apiserver_ready)

    def _apiserver_ready(self) -> bool:
        try:
            with self.http() as http:
                return http.get("/readyz").status_code == 200
        except httpx.HTTPError:
            return False

    def _component_kubeconfig(self, user: str) -> Path:
        return self.kubeconfig_for(user, name=user.replace("system:", ""))

    def _secure_health(self, port: int) -> bool:
        try:
            return (
                httpx.get(f"https://{HOST}:{port}/healthz", verify=False, timeout=2).status_code
                == 200
            )
        except httpx.HTTPError:
            return False

    def _component(self, program: str, user: str, extra: list[str]) -> Process:
        """kube-scheduler or kube-controller-manager: the plane's own client certificate
        for the API and for delegated authentication, no leader election, HTTPS on a free
        loopback port whose /healthz says ready."""
        kubeconfig = self._component_kubeconfig(user)
        port = free_port()
        args = [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            f"--bind-address={HOST}",
            f"--secure-port={port}",
            *extra,
        ]
        return self._part(program, args, lambda: self._secure_health(port))

    def _scheduler(self) -> Process:
        return self._component("kube-scheduler", "system:kube-scheduler", [])

    def _controller_manager(self) -> Process:
        return self._component(
            "kube-controller-manager",
            "system:kube-controller-manager",
            [
                f"--service-account-private-key-file={self.service_accounts.key}",
                f"--root-ca-file={self.ca.cert}",
                # Each controller as its own service account, with the roles kube-apiserver
                # bootstraps for it (system:kube-controller-manager alone may do little).
                "--use-service-account-credentials=true",
                # The node-lifecycle controller would taint kwok's nodes between heartbeats.
                "--controllers=*,-nodelifecycle,-cloud-node-lifecycle,-nodeipam,-route,-service",
            ],
        )

    def _kwok(self) -> Process:
        port = free_port()
        args = [
            f"--kubeconfig={self.kubeconfig}",
            f"--config={self.tools.data('kwok/stages.yaml')}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={FAKE_NODE}=fake",
            "--cidr=10.0.0.0/16",
            f"--node-ip={HOST}",
            f"--server-address={HOST}:{port}",
        ]
        return self._part("kwok", args, lambda: _answers(f"http://{HOST}:{port}/healthz"))

    # --- the lifecycle ----------------------------------------------------------------------

    def start(self) -> ControlPlane:
        try:
            self.etcd.spawn().ready(READY_TIMEOUT)
            self.apiserver.spawn().ready(READY_TIMEOUT)
            for part in self.extras:
                part.spawn()
            for part in self.extras:
                part.ready(READY_TIMEOUT)
            for directory in self.crd_dirs:
                self.apply_crds(directory)
            if self.kwok is not None:
                self.add_node("kwok-node-0")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every part (the newest first) and keep the directory for its logs."""
        parts = [*reversed(self.extras), self.apiserver, self.etcd]
        error = first_error([part.stop for part in parts])
        if error is not None:
            raise error

    # An outage kills the part, as a crash would: a SIGTERMed kube-apiserver whose clients
    # keep watches open waits out its HTTP server's shutdown (20 s here), and etcd its own.
    # Nothing is lost: etcd's writes are in the page cache, which outlives the process.

    def stop_apiserver(self, sig: int = signal.SIGKILL) -> None:
        self.apiserver.stop(sig)

    def start_apiserver(self) -> None:
        self.apiserver.spawn().ready(READY_TIMEOUT)

    def stop_etcd(self, sig: int = signal.SIGKILL) -> None:
        self.etcd.stop(sig)

    def start_etcd(self) -> None:
        self.etcd.spawn().ready(READY_TIMEOUT)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what tests ask of it ---------------------------------------------------------------

    def apply_crds(self, directory: Path) -> list[str]:
        """Apply (server-side) every CustomResourceDefinition in ``directory``'s YAML files
        and wait until each is Established; their names."""
        names = []
        paths = sorted(directory.glob("*.yaml"))
        if not paths:  # an empty plane would fail later, far from the cause
            raise MissingTools(f"no CRDs in {directory}: `make kube-tools` copies Karpenter's")
        with self.http() as http:
            for path in paths:
                for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
                    if isinstance(document, dict) and document.get("kind") == CRD_KIND:
                        name = document["metadata"]["name"]
                        server_side_apply(http, f"{CRDS_PATH}/{name}", document)
                        names.append(name)
            for name in names:
                established = partial(_has_condition, http, f"{CRDS_PATH}/{name}", "Established")
                _wait(established, ESTABLISHED_TIMEOUT, f"CRD {name} to be Established")
        return names

    def add_node(self, name: str, labels: dict[str, str] | None = None) -> None:
        """A fake node for kwok to run, Ready before this returns."""
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {FAKE_NODE: "fake"},
                "labels": {"kubernetes.io/hostname": name, "type": "kwok", **(labels or {})},
            },
        }
        with self.http() as http:
            server_side_apply(http, f"/api/v1/nodes/{name}", body)
            ready = partial(_has_condition, http, f"/api/v1/nodes/{name}", "Ready")
            _wait(ready, READY_TIMEOUT, f"kwok to make node {name} Ready")

    def compact(self) -> int:
        """Compact etcd at its current revision, as kube-apiserver does every few minutes;
        the revision."""
        with httpx.Client(base_url=self.etcd_url, timeout=10) as http:
            header = http.post("/v3/kv/range", json={"key": _b64(b"/"), "limit": 1}).json()
            revision = int(header["header"]["revision"])
            answer = http.post("/v3/kv/compaction", json={"revision": revision, "physical": True})
            answer.raise_for_status()
        return revision

    def delete_from_etcd(self, key: str) -> int:
        """Delete one object's key (``/registry/...``) in etcd itself, behind kube-apiserver's
        back: what another API server replica's write looks like to a reader whose watch
        was down. The number of keys deleted."""
        with httpx.Client(base_url=self.etcd_url, timeout=10) as http:
            answer = http.post("/v3/kv/deleterange", json={"key": _b64(key.encode())})
            answer.raise_for_status()
        return int(answer.json().get("deleted", 0))

    def logs_tail(self) -> str:
        return "\n".join(f"{p.name}: {p.tail()}" for p in [self.etcd, self.apiserver, *self.extras])


def server_side_apply(
    http: httpx.Client, path: str, document: dict[str, Any], manager: str = MANAGER
) -> None:
    """Apply ``document`` at ``path`` (forced: the plane's own writes win), or one line."""
    answer = http.patch(
        path,
        params={"fieldManager": manager, "force": "true"},
        content=json.dumps(document),
        headers={"Content-Type": "application/apply-patch+yaml"},
    )
    if answer.status_code >= 300:
        raise RuntimeError(f"apply {path}: {answer.status_code} {answer.text[:500]}")


def _has_condition(http: httpx.Client, path: str, kind: str) -> bool:
    answer = http.get(path)
    if answer.status_code != 200:
        return False
    return has_condition(answer.json(), kind)


def _wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        time.sleep(0.05)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _context(ca: Path, pair: Pair) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(str(pair.cert), str(pair.key))
    return context


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code < 500
    except httpx.HTTPError:
        return False


def _etcd_healthy(url: str) -> bool:
    try:
        return bool(json.loads(httpx.get(f"{url}/health", timeout=2).text).get("health") == "true")
    except (httpx.HTTPError, ValueError):
        return False


@contextlib.contextmanager
def running(workdir: Path, **options: Any) -> Iterator[ControlPlane]:
    plane = ControlPlane(workdir, **options)
    with plane:
        yield plane

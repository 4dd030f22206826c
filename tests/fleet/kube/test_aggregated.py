"""``serve-apiserver`` as an aggregated API server behind the real kube-apiserver.

Registered as an operator registers it: an APIService (manifests/base/apiservice.yaml,
its caBundle the CA that issued the serving certificate) whose Service is an
ExternalName Service naming 127.0.0.1. kube-apiserver resolves the Service itself: with
``--enable-aggregator-routing`` off, a ClusterIP Service is dialled at its cluster IP,
which nothing routes here (and a manual EndpointSlice may not name a loopback address),
while an ExternalName Service is dialled at its name and the APIService's port
(k8s.io/apiserver's ResolveCluster); the availability check skips the endpoint check for
it. kube-apiserver checks the serving certificate against the
name ``<service>.<namespace>.svc``, shows its front-proxy client certificate, and names
the user in X-Remote-* headers; serve-apiserver believes them only from that CA and asks
kube-apiserver (as its own service account, with the manifests' rights) to authorize
each request with a SubjectAccessReview against the real RBAC roles.

kubectl reaches the Sandbox API through kube-apiserver. What only a direct connection can
show stays direct: a certificate of another common name or another CA, a request without
one, and the review cache's TTL (through kube-apiserver, its own RBAC check answers first,
with no cache).
"""

from __future__ import annotations

import base64
import json
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from sandboxctl_testing.controlplane.pki import Authority, Pair
from tests.fleet.kube.fleet import KubeFleet, Process, skip_reason
from tests.fleet.kube.identities import BASE, NAMESPACE, can_i, kubectl
from tests.sandboxd.servers import free_port, wait_until

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))
SANDBOXES = "/apis/agents.x-k8s.io/v1beta1/namespaces/default/sandboxes"
APISERVICES = "/apis/apiregistration.k8s.io/v1/apiservices"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
SERVICE = "sandboxctl-apiserver"  # the APIService's service, in NAMESPACE
AVAILABLE_TIMEOUT = 60.0


@dataclass
class Aggregated:
    url: str
    serving_ca: Path
    front_proxy: Pair  # the plane's own front-proxy client certificate
    intruder: Pair  # signed by the front-proxy CA, another common name
    stranger: Pair  # common name front-proxy-client, signed by another CA
    process: Process
    apiservice: str

    def get(
        self, path: str, cert: Pair | None, user: str = "alice", method: str = "GET"
    ) -> httpx.Response:
        """A request straight to serve-apiserver, as the front proxy would make it."""
        context = ssl.create_default_context(cafile=str(self.serving_ca))
        if cert is not None:
            context.load_cert_chain(str(cert.cert), str(cert.key))
        headers = {"X-Remote-User": user, "X-Remote-Group": "system:authenticated"}
        with httpx.Client(verify=context, timeout=10) as http:
            return http.request(method, f"{self.url}{path}", headers=headers)


def grant(fleet: KubeFleet, user: str, verbs: list[str]) -> None:
    """A ClusterRole on sandboxes with ``verbs``, bound to ``user``."""
    name = f"sandboxes-{user}"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [{"apiGroups": ["agents.x-k8s.io"], "resources": ["sandboxes"], "verbs": verbs}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    with fleet.plane.http() as http:
        assert http.post(f"{RBAC}/clusterroles", json=role).status_code == 201
        assert http.post(f"{RBAC}/clusterrolebindings", json=binding).status_code == 201


def register(fleet: KubeFleet, port: int, serving_ca: Path) -> str:
    """The manifests' APIService, its Service an ExternalName one for 127.0.0.1 and its
    port serve-apiserver's, applied with kubectl; the APIService's name."""
    apiservice = yaml.safe_load((BASE / "apiservice.yaml").read_text(encoding="utf-8"))
    apiservice["spec"]["caBundle"] = base64.b64encode(serving_ca.read_bytes()).decode()
    apiservice["spec"]["service"]["port"] = port
    assert apiservice["spec"]["service"] == {"name": SERVICE, "namespace": NAMESPACE, "port": port}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": NAMESPACE},
        "spec": {
            "type": "ExternalName",
            "externalName": "127.0.0.1",
            "ports": [{"name": "https", "port": port}],
        },
    }
    documents = yaml.safe_dump_all([service, apiservice])
    kubectl(fleet.plane.kubeconfig, "apply", "--filename=-", stdin=documents)
    return str(apiservice["metadata"]["name"])


def condition(fleet: KubeFleet, apiservice: str, kind: str) -> dict[str, Any]:
    with fleet.plane.http() as http:
        answer = http.get(f"{APISERVICES}/{apiservice}")
    answer.raise_for_status()
    conditions = answer.json().get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == kind), {})


@pytest.fixture
def aggregated(kube_fleet: KubeFleet) -> Aggregated:
    plane, work = kube_fleet.plane, kube_fleet.workdir
    serving_ca = Authority(work, "serving-ca")
    # The name kube-apiserver checks, and 127.0.0.1 for the direct requests.
    serving = serving_ca.issue(
        "serving", SERVICE, hosts=[f"{SERVICE}.{NAMESPACE}.svc", "127.0.0.1"]
    )
    intruder = plane.front_proxy_ca.issue("intruder", "intruder")
    stranger = Authority(work, "stranger-ca").issue("stranger", "front-proxy-client")
    kube_fleet.add_node("node-a")
    kube_fleet.ready()  # the node's agent and publisher: what a create needs
    port = free_port()
    process = Process(
        "aggregated",
        [
            "serve-apiserver",
            "--source",
            "kube",
            "--kubeconfig",
            str(kube_fleet.identities.apiserver),
            "--sandboxd-token-file",
            str(kube_fleet.files()["root"]),
            "--no-warm-pool-driver",
            "--listen",
            f"127.0.0.1:{port}",
            "--tls-cert-file",
            str(serving.cert),
            "--tls-private-key-file",
            str(serving.key),
            "--requestheader-client-ca-file",
            str(plane.front_proxy_ca.cert),
            "--authorization-cache-ttl",
            "3s",
        ],
        f"https://127.0.0.1:{port}/healthz",
        work,
    )
    kube_fleet.apiservers.append((process, "", ""))
    process.spawn()
    context = ssl.create_default_context(cafile=str(serving_ca.cert))
    wait_until(
        lambda: _healthy(f"https://127.0.0.1:{port}/healthz", context) or not process.running,
        timeout=60,
        what="the aggregated server",
    )
    assert process.running, process.output()
    apiservice = register(kube_fleet, port, serving_ca.cert)
    return Aggregated(
        f"https://127.0.0.1:{port}",
        serving_ca.cert,
        plane.front_proxy_client,
        intruder,
        stranger,
        process,
        apiservice,
    )


def _healthy(url: str, context: ssl.SSLContext) -> bool:
    try:
        return httpx.get(url, verify=context, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wait_available(fleet: KubeFleet, aggregated: Aggregated) -> None:
    deadline = time.monotonic() + AVAILABLE_TIMEOUT
    while (state := condition(fleet, aggregated.apiservice, "Available")).get("status") != "True":
        if time.monotonic() > deadline:
            output = aggregated.process.output()
            raise AssertionError(f"APIService not Available: {state}; {output}")
        time.sleep(0.1)


def test_kubectl_reaches_the_sandbox_api_through_kube_apiserver(
    aggregated: Aggregated, kube_fleet: KubeFleet
) -> None:
    wait_available(kube_fleet, aggregated)
    plane = kube_fleet.plane
    grant(kube_fleet, "alice", ["get", "list", "watch", "create", "delete"])
    alice = plane.kubeconfig_for("alice")
    mallory = plane.kubeconfig_for("mallory")
    # Discovery through the aggregator lists the resource (kube-apiserver fetched it from
    # serve-apiserver; it may take a discovery round after Available).
    wait_until(
        lambda: "sandboxes" in _resources(alice),
        timeout=30,
        what="kubectl api-resources to list sandboxes",
    )
    # kube-apiserver aggregates serve-apiserver's OpenAPI v3 too (fetched as
    # system:aggregator), so kubectl explains the resource.
    wait_until(
        lambda: kubectl(alice, "explain", "sandboxes.spec", check=False).returncode == 0,
        timeout=30,
        what="kubectl explain to know the Sandbox schema",
    )
    assert can_i(alice, "create", "sandboxes.agents.x-k8s.io", namespace="default")
    assert not can_i(mallory, "list", "sandboxes.agents.x-k8s.io", namespace="default")

    manifest = {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": "via-aggregator", "namespace": "default"},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "m", "image": "base"}]}}},
    }
    created = kubectl(alice, "create", "--filename=-", "--output=json", stdin=json.dumps(manifest))
    obj = json.loads(created.stdout)
    assert obj["status"]["nodeName"] == "node-a"
    listed = kubectl(alice, "get", "sandboxes", "--namespace=default", "--output=name")
    assert listed.stdout.split() == ["sandbox.agents.x-k8s.io/via-aggregator"]
    table = kubectl(alice, "get", "sandboxes", "--namespace=default")
    assert table.stdout.splitlines()[0].split()[0] == "NAME"
    assert "via-aggregator" in table.stdout

    # kube-apiserver's own RBAC check answers the user without rights, with the reason.
    refused = kubectl(mallory, "get", "sandboxes", "--namespace=default", check=False)
    assert refused.returncode == 1
    assert "(Forbidden)" in refused.stderr
    assert 'User "mallory" cannot list resource "sandboxes"' in refused.stderr
    with plane.http(plane.ca.issue("mallory-direct", "mallory")) as http:
        assert http.get(SANDBOXES).status_code == 403

    kubectl(alice, "delete", "sandbox", "via-aggregator", "--namespace=default", "--wait=false")
    wait_until(
        lambda: (
            kubectl(alice, "get", "sandboxes", "--namespace=default", "--output=name").stdout == ""
        ),
        timeout=15,
        what="the deleted sandbox to leave the list",
    )


def _resources(kubeconfig: Path) -> set[str]:
    answer = kubectl(
        kubeconfig, "api-resources", "--api-group=agents.x-k8s.io", "--output=name", check=False
    )
    return {line.split(".")[0] for line in answer.stdout.split()}


def test_requestheader_authentication(aggregated: Aggregated, kube_fleet: KubeFleet) -> None:
    grant(kube_fleet, "alice", ["get", "list", "watch"])
    assert aggregated.get(SANDBOXES, aggregated.front_proxy).status_code == 200
    assert aggregated.get(SANDBOXES, None).status_code == 401  # headers without a certificate
    assert aggregated.get(SANDBOXES, aggregated.intruder).status_code == 401  # a name not allowed
    assert aggregated.get(SANDBOXES, aggregated.front_proxy, user="").status_code == 401
    with pytest.raises(httpx.HTTPError):  # the handshake refuses another CA's certificate
        aggregated.get(SANDBOXES, aggregated.stranger)


def test_subject_access_review_with_a_short_cache(
    aggregated: Aggregated, kube_fleet: KubeFleet
) -> None:
    grant(kube_fleet, "alice", ["get", "list", "watch"])
    denied = aggregated.get(f"{SANDBOXES}/x", aggregated.front_proxy, method="DELETE")
    assert denied.status_code == 403
    assert 'User "alice" cannot delete resource "sandboxes"' in denied.json()["message"]
    # Discovery is a non-resource request, allowed by system:discovery to the authenticated.
    assert (
        aggregated.get("/apis/agents.x-k8s.io/v1beta1", aggregated.front_proxy).status_code == 200
    )
    assert aggregated.get(SANDBOXES, aggregated.front_proxy, user="bob").status_code == 403
    grant(kube_fleet, "bob", ["list"])
    # The denial is cached for the TTL, then the new binding is seen.
    assert aggregated.get(SANDBOXES, aggregated.front_proxy, user="bob").status_code == 403
    wait_until(
        lambda: aggregated.get(SANDBOXES, aggregated.front_proxy, user="bob").status_code == 200,
        timeout=10,
        what="the cached denial to expire",
    )
    # With kube-apiserver away, a cached answer still serves and a new review is 503.
    kube_fleet.plane.stop_apiserver()
    assert aggregated.get(SANDBOXES, aggregated.front_proxy, user="bob").status_code == 200
    assert aggregated.get(SANDBOXES, aggregated.front_proxy, user="carol").status_code == 503
    kube_fleet.plane.start_apiserver()

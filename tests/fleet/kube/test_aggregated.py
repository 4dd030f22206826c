"""``serve-apiserver`` as an aggregated API server, tested the way kube-apiserver's
aggregation layer calls it: TLS, a front-proxy client certificate with the user in
request headers, and authorization through SubjectAccessReview (answered by the double's
RBAC), cached for ``--authorization-cache-ttl``. (A real aggregation layer, and kubectl
through it, cannot run here: there is no kube-apiserver.)"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trustme

from tests.fleet.kube.fleet import KubeFleet, Process
from tests.sandboxd.servers import free_port, wait_until

SANDBOXES = "/apis/agents.x-k8s.io/v1beta1/namespaces/default/sandboxes"
RBAC = "apis/rbac.authorization.k8s.io/v1"


@dataclass
class Aggregated:
    url: str
    serving_ca: trustme.CA
    front_proxy: Path  # a cert+key PEM with CN front-proxy-client
    intruder: Path  # signed by the same CA, another CN
    stranger: Path  # CN front-proxy-client, signed by another CA
    process: Process

    def get(
        self, path: str, cert: Path | None, user: str = "alice", method: str = "GET"
    ) -> httpx.Response:
        context = ssl.create_default_context()
        self.serving_ca.configure_trust(context)
        if cert is not None:
            context.load_cert_chain(cert)
        headers = {"X-Remote-User": user, "X-Remote-Group": "system:authenticated"}
        with httpx.Client(verify=context, timeout=10) as http:
            return http.request(method, f"{self.url}{path}", headers=headers)


def grant(fleet: KubeFleet, user: str, verbs: list[str]) -> None:
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
    assert httpx.post(f"{fleet.double.url}/{RBAC}/clusterroles", json=role).status_code == 201
    assert (
        httpx.post(f"{fleet.double.url}/{RBAC}/clusterrolebindings", json=binding).status_code
        == 201
    )


@pytest.fixture
def aggregated(kube_fleet: KubeFleet) -> Aggregated:
    work = kube_fleet.workdir
    serving_ca, proxy_ca, other_ca = trustme.CA(), trustme.CA(), trustme.CA()
    server = serving_ca.issue_cert("127.0.0.1")
    server.cert_chain_pems[0].write_to_path(work / "tls.crt")
    server.private_key_pem.write_to_path(work / "tls.key")
    proxy_ca.cert_pem.write_to_path(work / "front-proxy-ca.crt")
    certs = {}
    for name, ca, cn in (
        ("front", proxy_ca, "front-proxy-client"),
        ("intruder", proxy_ca, "intruder"),
        ("stranger", other_ca, "front-proxy-client"),
    ):
        issued = ca.issue_cert(cn, common_name=cn)
        path = work / f"{name}.pem"
        issued.private_key_and_cert_chain_pem.write_to_path(path)
        certs[name] = path
    port = free_port()
    files = kube_fleet.files()
    process = Process(
        "aggregated",
        [
            "serve-apiserver",
            "--source",
            "kube",
            "--kubeconfig",
            str(kube_fleet.kubeconfig),
            "--sandboxd-token-file",
            str(files["root"]),
            "--no-warm-pool-driver",
            "--listen",
            f"127.0.0.1:{port}",
            "--tls-cert-file",
            str(work / "tls.crt"),
            "--tls-private-key-file",
            str(work / "tls.key"),
            "--requestheader-client-ca-file",
            str(work / "front-proxy-ca.crt"),
            "--authorization-cache-ttl",
            "3s",
        ],
        f"https://127.0.0.1:{port}/healthz",
        work,
    )
    kube_fleet.apiservers.append((process, "", ""))
    process.spawn()
    context = ssl.create_default_context()
    serving_ca.configure_trust(context)
    wait_until(
        lambda: _healthy(f"https://127.0.0.1:{port}/healthz", context) or not process.running,
        timeout=60,
        what="the aggregated server",
    )
    assert process.running, process.output()
    return Aggregated(
        f"https://127.0.0.1:{port}",
        serving_ca,
        certs["front"],
        certs["intruder"],
        certs["stranger"],
        process,
    )


def _healthy(url: str, context: ssl.SSLContext) -> bool:
    try:
        return httpx.get(url, verify=context, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


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
    # With the control plane away, a cached answer still serves and a new review is 503.
    kube_fleet.double.stop()
    assert aggregated.get(SANDBOXES, aggregated.front_proxy, user="bob").status_code == 200
    assert aggregated.get(SANDBOXES, aggregated.front_proxy, user="carol").status_code == 503

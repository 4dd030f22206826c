"""The Helm chart (charts/sandboxctl): ``helm lint`` passes, the defaults render every part
(two API server replicas, the publisher DaemonSet, the APIService, the guard, RBAC), the
chart renders the same objects as the kustomize trees it mirrors (so the two cannot drift),
its CRDs are manifests/crds byte for byte, a bad value fails with a clear message, and
``helm install`` against a real kube-apiserver makes the objects.

helm is the one ``make kube-tools`` builds from its Go module; kubectl (for kustomize) the
pinned one. The tests that run either skip, saying which, when it is not there."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes import client

import sandboxctl
from sandboxctl_testing.controlplane import ControlPlane, Tools
from tests.testing.kubeapi.double import PINNED_KUBECTL, REPO

CHART = REPO / "charts" / "sandboxctl"
MANIFESTS = REPO / "manifests"
HELM = Tools.find().directory / "helm"
NEEDS_HELM = pytest.mark.skipif(
    not HELM.exists(), reason=f"needs helm built from its Go module in {HELM} (make kube-tools)"
)
NEEDS_KUBECTL = pytest.mark.skipif(
    not PINNED_KUBECTL.exists(), reason="needs the pinned kubectl for kustomize (make kubectl)"
)
NAMESPACE = "sandbox-system"  # the kustomize base's namespace
# Only the APIService's caBundle has no default (it is the operator's CA); the drift check
# passes the base's placeholder.
BASE_CA_BUNDLE = "Q0EtQlVORExFLVBMQUNFSE9MREVS"
# The labels the chart adds to every object (templates/_helpers.tpl): all that the drift
# check removes before comparing.
CHART_LABELS = frozenset(
    {
        "app.kubernetes.io/part-of",
        "app.kubernetes.io/managed-by",
        "app.kubernetes.io/instance",
        "helm.sh/chart",
    }
)
# What one side has and the other cannot: kustomize makes the namespace (Helm's way is the
# release's namespace, --create-namespace); the chart runs the publisher in the cluster
# (kustomize's hosts run it from systemd, with the same account).
ONLY_KUSTOMIZE = {("Namespace", NAMESPACE)}
ONLY_CHART = {("DaemonSet", "sandboxctl-publisher")}

Key = tuple[str, str]


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=120)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def render(*values: str, namespace: str = NAMESPACE, crds: bool = False) -> list[dict[str, Any]]:
    """``helm template`` of the chart with ``values`` (helm flags), as objects."""
    args = ["template", "sandboxctl", str(CHART), "--namespace", namespace, *values]
    out = helm(*args, *(["--include-crds"] if crds else [])).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def kustomize(tree: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [str(PINNED_KUBECTL), "kustomize", str(MANIFESTS / tree)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_key(objects: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    keyed = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    assert len(keyed) == len(objects), "two objects share a kind and name"
    return keyed


def without_chart_labels(obj: dict[str, Any]) -> dict[str, Any]:
    metadata = dict(obj["metadata"])
    labels = {k: v for k, v in metadata.pop("labels", {}).items() if k not in CHART_LABELS}
    if labels:
        metadata["labels"] = labels
    return {**obj, "metadata": metadata}


def differences(built: Any, rendered: Any, path: str = "") -> list[str]:
    """Where two objects differ, as paths with the kustomize and the chart value."""
    if isinstance(built, dict) and isinstance(rendered, dict):
        return [
            line
            for key in sorted(built.keys() | rendered.keys())
            for line in differences(built.get(key), rendered.get(key), f"{path}.{key}")
        ]
    if isinstance(built, list) and isinstance(rendered, list) and len(built) == len(rendered):
        return [
            line
            for index, (b, r) in enumerate(zip(built, rendered, strict=True))
            for line in differences(b, r, f"{path}[{index}]")
        ]
    return [] if built == rendered else [f"{path}: kustomize {built!r}, chart {rendered!r}"]


def with_ca(bundle: str = BASE_CA_BUNDLE) -> list[str]:
    return ["--set", f"apiService.caBundle={bundle}"]


# --- the chart's files ------------------------------------------------------------------------


def test_the_chart_follows_the_project_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == sandboxctl.__version__
    assert chart["appVersion"] == sandboxctl.__version__


def test_the_charts_crds_are_the_manifests_crds_byte_for_byte() -> None:
    source = {p.name: p.read_bytes() for p in (MANIFESTS / "crds").glob("*.yaml")}
    del source["kustomization.yaml"]
    chart = {p.name: p.read_bytes() for p in (CHART / "crds").iterdir()}
    assert chart.keys() == source.keys(), "run scripts/sync-chart-crds"
    assert [n for n in chart if chart[n] != source[n]] == [], "run scripts/sync-chart-crds"


# --- helm lint and the defaults ---------------------------------------------------------------


@NEEDS_HELM
@pytest.mark.parametrize("values", [[], ["-f", str(CHART / "values-small.yaml")]])
def test_helm_lint_passes(values: list[str]) -> None:
    linted = helm("lint", "--strict", str(CHART), *values, *with_ca())
    assert "1 chart(s) linted, 0 chart(s) failed" in linted.stdout


@NEEDS_HELM
def test_the_defaults_render_every_part() -> None:
    objects = render(*with_ca(), crds=True)
    keyed = by_key(objects)
    deployments = {name: o for (kind, name), o in keyed.items() if kind == "Deployment"}
    assert {name: d["spec"]["replicas"] for name, d in deployments.items()} == {
        "sandboxctl-apiserver": 2,
        "sandboxctl-proxy": 2,
        "sandboxctl-guard-workers": 1,
    }
    assert ("DaemonSet", "sandboxctl-publisher") in keyed
    assert keyed[("APIService", "v1beta1.agents.x-k8s.io")]["spec"]["caBundle"] == BASE_CA_BUNDLE
    assert {name for kind, name in keyed if kind == "CustomResourceDefinition"} == {
        "nodeinventories.sandbox.cocoonstack.io",
        "sandboxwarmpools.extensions.agents.x-k8s.io",
        "sandboxtemplates.extensions.agents.x-k8s.io",
    }
    accounts = {name for kind, name in keyed if kind == "ServiceAccount"}
    assert accounts == {
        f"sandboxctl-{part}" for part in ("apiserver", "proxy", "publisher", "guard-workers")
    }
    for account in accounts:
        assert ("ClusterRole", account) in keyed
        assert ("ClusterRoleBinding", account) in keyed
    for obj in objects:
        kubernetes_validate.validate(obj, "1.35.0", strict=True)


@NEEDS_HELM
def test_every_namespaced_reference_follows_the_release_namespace() -> None:
    objects = render(*with_ca(), namespace="team-a")
    guard_rbac = {("Role", "sandboxctl-guard-workers"), ("RoleBinding", "sandboxctl-guard-workers")}
    for obj in objects:
        key = (obj["kind"], obj["metadata"]["name"])
        if obj["kind"] in ("ClusterRole", "ClusterRoleBinding", "APIService"):
            assert "namespace" not in obj["metadata"], key
        else:
            expected = "workers" if key in guard_rbac else "team-a"
            assert obj["metadata"]["namespace"] == expected, key
        assert {s["namespace"] for s in obj.get("subjects", [])} <= {"team-a"}, key
    service = by_key(objects)[("APIService", "v1beta1.agents.x-k8s.io")]["spec"]["service"]
    assert service["namespace"] == "team-a"
    assert NAMESPACE not in yaml.safe_dump_all(objects)


# --- the drift check against the kustomize trees ----------------------------------------------


@NEEDS_HELM
@NEEDS_KUBECTL
@pytest.mark.parametrize(
    ("trees", "values"),
    [
        (("base", "guard"), []),
        (("overlays/small", "guard"), ["-f", str(CHART / "values-small.yaml")]),
    ],
    ids=["base", "small"],
)
def test_the_chart_renders_what_kustomize_builds(trees: tuple[str, ...], values: list[str]) -> None:
    built = by_key([o for tree in trees for o in kustomize(tree)])
    rendered = {
        key: without_chart_labels(o)
        for key, o in by_key(render(*values, *with_ca(), crds=True)).items()
    }
    assert built.keys() - rendered.keys() == ONLY_KUSTOMIZE
    assert rendered.keys() - built.keys() == ONLY_CHART
    drift = {key: differences(built[key], rendered[key]) for key in built.keys() & rendered.keys()}
    assert {key: paths for key, paths in drift.items() if paths} == {}


@NEEDS_HELM
@NEEDS_KUBECTL
def test_the_charts_crds_install_as_kustomize_builds_them() -> None:
    crds = [o for o in render(*with_ca(), crds=True) if o["kind"] == "CustomResourceDefinition"]
    assert by_key(crds) == by_key(kustomize("crds"))


@NEEDS_HELM
def test_the_sandbox_hosts_busy_source_adds_its_rbac_as_the_guard_tree_has_it() -> None:
    rendered = by_key(render(*with_ca(), "--set", "guard.busySource=sandbox-hosts"))
    path = MANIFESTS / "guard" / "rbac-sandbox-hosts.yaml"
    for obj in yaml.safe_load_all(path.read_text()):
        key = (obj["kind"], obj["metadata"]["name"])
        assert without_chart_labels(rendered[key]) == obj
    default = by_key(render(*with_ca()))
    assert ("ClusterRole", "sandboxctl-guard-workers-sandbox-hosts") not in default


# --- the publisher DaemonSet ------------------------------------------------------------------


@NEEDS_HELM
def test_the_publisher_runs_publish_for_its_own_node_with_its_own_account() -> None:
    selector, toleration = {"sandbox.cocoonstack.io/host": "true"}, {"operator": "Exists"}
    keyed = by_key(
        render(
            *with_ca(),
            "--set-json",
            f"publisher.nodeSelector={json.dumps(selector)}",
            "--set-json",
            f"publisher.tolerations={json.dumps([toleration])}",
        )
    )
    pod = keyed[("DaemonSet", "sandboxctl-publisher")]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == selector
    assert pod["tolerations"] == [toleration]
    assert pod["serviceAccountName"] == "sandboxctl-publisher"
    (container,) = pod["containers"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {"NODE_NAME": "spec.nodeName", "HOST_IP": "status.hostIP"}
    args = container["args"]
    assert args[0] == "publish"
    assert "--node=$(NODE_NAME)" in args
    assert "--interval=30s" in args  # the readers' --publish-interval
    usage = subprocess.run(
        [sys.executable, "-m", "sandboxctl", "publish", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert [a for a in args[1:] if a.split("=", 1)[0] not in usage] == []
    binding = keyed[("ClusterRoleBinding", "sandboxctl-publisher")]
    assert binding["roleRef"]["name"] == "sandboxctl-publisher"
    assert binding["subjects"][0]["name"] == "sandboxctl-publisher"


@NEEDS_HELM
def test_each_part_but_the_api_server_can_be_left_out() -> None:
    keyed = by_key(
        render(
            *[
                f"--set={part}.enabled=false"
                for part in ("apiService", "proxy", "publisher", "guard")
            ]
        )
    )
    assert {name for kind, name in keyed if kind in ("Deployment", "DaemonSet", "APIService")} == {
        "sandboxctl-apiserver"
    }
    # Hosts outside the cluster publish from systemd with the publisher's account.
    assert ("ClusterRoleBinding", "sandboxctl-publisher") in keyed
    assert not any("proxy" in name or "guard" in name for _, name in keyed)


# --- bad values -------------------------------------------------------------------------------


@NEEDS_HELM
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("apiserver.replicas=-1", "at '/apiserver/replicas': minimum: got -1, want 1"),
        ("proxy.replicas=0", "at '/proxy/replicas': minimum: got 0, want 1"),
        ("apiserver.replica=3", "at '/apiserver': additional properties 'replica' not allowed"),
        ("inventory.staleAfter=90", "at '/inventory/staleAfter'"),
        ("guard.busySource=everything", "at '/guard/busySource'"),
    ],
)
@pytest.mark.parametrize("command", ["lint", "template"])
def test_a_bad_value_is_refused_by_the_schema(command: str, value: str, message: str) -> None:
    refused = helm(command, str(CHART), *with_ca(), "--set", value, check=False)
    assert refused.returncode != 0
    assert "values don't meet the specifications of the schema" in refused.stdout + refused.stderr
    assert message in refused.stdout + refused.stderr


@NEEDS_HELM
def test_the_apiservice_without_a_ca_bundle_is_refused_with_how_to_give_one() -> None:
    refused = helm("template", str(CHART), check=False)
    assert refused.returncode != 0
    assert "apiService.caBundle is required" in refused.stderr
    assert "--set apiService.caBundle=$(base64 -w0 ca.crt)" in refused.stderr
    # helm lint only notes a missing required value (it lints charts before their values are
    # known); template and install refuse it.
    linted = helm("lint", "--strict", str(CHART))
    assert "Missing required value: apiService.caBundle is required" in linted.stderr


# --- helm install against a real control plane -----------------------------------------------

RELEASE_NAMESPACE = "sandboxctl-helm"
WORKERS = "workers"  # guard.workersNamespace's default: its Role goes there
NEEDS_PLANE = pytest.mark.skipif(
    bool(Tools.find().missing(("etcd", "kube-apiserver", "helm"))),
    reason="needs etcd, kube-apiserver and helm built from their Go modules (make kube-tools)",
)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    started = ControlPlane(tmp_path_factory.mktemp("plane"), crds=[]).start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def installed(plane: ControlPlane) -> Iterator[client.ApiClient]:
    """The chart installed with its defaults by ``helm install`` into a fresh namespace; the
    admin's client."""
    api = plane.api()
    client.CoreV1Api(api).create_namespace({"metadata": {"name": WORKERS}})
    ca_bundle = base64.b64encode(plane.ca.cert.read_bytes()).decode()
    helm(
        "install", "sandboxctl", str(CHART),
        "--kubeconfig", str(plane.kubeconfig),
        "--namespace", RELEASE_NAMESPACE, "--create-namespace",
        *with_ca(ca_bundle),
    )  # fmt: skip
    try:
        yield api
    finally:
        api.close()


def may(api: client.ApiClient, account: str, verb: str, resource: str, group: str) -> bool:
    review = client.AuthorizationV1Api(api).create_subject_access_review(
        client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                user=f"system:serviceaccount:{RELEASE_NAMESPACE}:{account}",
                groups=["system:serviceaccounts", "system:authenticated"],
                resource_attributes=client.V1ResourceAttributes(
                    verb=verb, group=group, resource=resource
                ),
            )
        )
    )
    return bool(review.status.allowed)


@NEEDS_PLANE
def test_helm_install_makes_every_part_on_a_real_apiserver(
    plane: ControlPlane, installed: client.ApiClient
) -> None:
    apps = client.AppsV1Api(installed)
    deployments = apps.list_namespaced_deployment(RELEASE_NAMESPACE).items
    assert {d.metadata.name: d.spec.replicas for d in deployments} == {
        "sandboxctl-apiserver": 2,
        "sandboxctl-proxy": 2,
        "sandboxctl-guard-workers": 1,
    }
    (daemonset,) = apps.list_namespaced_daemon_set(RELEASE_NAMESPACE).items
    assert daemonset.metadata.name == "sandboxctl-publisher"
    service = client.ApiregistrationV1Api(installed).read_api_service("v1beta1.agents.x-k8s.io")
    assert service.spec.service.namespace == RELEASE_NAMESPACE
    assert base64.b64decode(service.spec.ca_bundle) == plane.ca.cert.read_bytes()
    crds = client.ApiextensionsV1Api(installed).list_custom_resource_definition().items
    established = {
        c.metadata.name
        for c in crds
        if any(cond.type == "Established" and cond.status == "True" for cond in c.status.conditions)
    }
    assert established >= {o["metadata"]["name"] for o in chart_crds()}
    roles = client.RbacAuthorizationV1Api(installed)
    assert roles.read_namespaced_role_binding("sandboxctl-guard-workers", WORKERS).subjects[
        0
    ].namespace == (RELEASE_NAMESPACE)
    listed = helm(
        "list", "--kubeconfig", str(plane.kubeconfig), "-n", RELEASE_NAMESPACE, "-o", "yaml"
    )
    (release,) = yaml.safe_load(listed.stdout)
    assert release["status"] == "deployed"
    assert release["app_version"] == sandboxctl.__version__


def chart_crds() -> list[dict[str, Any]]:
    """The CRDs as the chart ships them (no kubectl needed)."""
    return [
        doc
        for path in sorted((CHART / "crds").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


@NEEDS_PLANE
@pytest.mark.parametrize(
    ("account", "verb", "resource", "group", "allowed"),
    [
        ("sandboxctl-publisher", "create", "nodeinventories", "sandbox.cocoonstack.io", True),
        ("sandboxctl-publisher", "patch", "nodeinventories", "sandbox.cocoonstack.io", True),
        ("sandboxctl-publisher", "list", "nodeinventories", "sandbox.cocoonstack.io", False),
        ("sandboxctl-publisher", "delete", "nodeinventories", "sandbox.cocoonstack.io", False),
        ("sandboxctl-proxy", "watch", "nodeinventories", "sandbox.cocoonstack.io", True),
        ("sandboxctl-proxy", "patch", "nodeinventories", "sandbox.cocoonstack.io", False),
        ("sandboxctl-apiserver", "create", "subjectaccessreviews", "authorization.k8s.io", True),
        ("sandboxctl-guard-workers", "list", "nodes", "", True),
        ("sandboxctl-guard-workers", "delete", "nodes", "", False),
    ],
)
def test_the_installed_accounts_have_their_rights_and_no_more(
    installed: client.ApiClient, account: str, verb: str, resource: str, group: str, allowed: bool
) -> None:
    assert may(installed, account, verb, resource, group) is allowed


# Last in the module: it undoes the install the tests above share.
@NEEDS_PLANE
def test_helm_uninstall_removes_the_release_and_keeps_the_crds(
    plane: ControlPlane, installed: client.ApiClient
) -> None:
    helm("uninstall", "sandboxctl", "--kubeconfig", str(plane.kubeconfig), "-n", RELEASE_NAMESPACE)
    apps = client.AppsV1Api(installed)
    deadline = time.monotonic() + 30
    while apps.list_namespaced_deployment(RELEASE_NAMESPACE).items:
        assert time.monotonic() < deadline, "the release's Deployments are still there"
        time.sleep(0.1)
    names = {
        c.metadata.name
        for c in client.ApiextensionsV1Api(installed).list_custom_resource_definition().items
    }
    # Helm never deletes a chart's crds/: the hosts' NodeInventory objects outlive a release.
    assert names >= {o["metadata"]["name"] for o in chart_crds()}

"""What the guard lanes need of a kit, apart from :class:`~sandboxctl.lanes.kit.Kit`: a
Kubernetes API with Karpenter's NodePools in it, worker Nodes and Pods to guard, the
workers' busy signal, ``guard-workers`` processes to start and kill, and the guard's CLI.

:class:`LocalGuardKit` builds that on the local kit's control plane (the API double):
it registers Karpenter's CRDs through the API, makes its objects in its own namespace,
serves the busy signal from this process (:class:`WorkerSignals`) and removes what it
made on close. The guard lanes run on the local kit only: on a real cluster they would
create Nodes and NodePools that its kubelets and Karpenter act on.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol, cast

import httpx
import yaml
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from sandboxctl.guard.adopt import Adopted, adopt
from sandboxctl.guard.pods import ANNOTATION, NODEPOOL_LABEL
from sandboxctl.kube import NODEPOOLS, KubeNotFound, Pods, api_client
from sandboxctl.kube.resources import MERGE_PATCH, has_condition
from sandboxctl.lanes.model import LaneError
from sandboxctl.lanes.observe import samples
from sandboxctl.lanes.processes import Process, first_error, free_port
from sandboxctl.lanes.workersignals import WorkerSignals

#: Karpenter's own CRDs (NodePool, NodeClaim, NodeOverlay and the kwok provider's
#: KWOKNodeClass), copied from the pinned Go module by ``scripts/build-kube-tools``
#: (``make kube-tools``); nothing upstream is committed.
KARPENTER_CRDS = Path(__file__).resolve().parents[2] / ".tools" / "crds" / "karpenter"
#: The kwok provider's node class: the one a NodePool's nodeClassRef may name here.
KWOK_NODECLASS = {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"}

#: The NodeClaim annotation where Karpenter writes a draining node's deadline (its drain
#: start + the NodeClaim's terminationGracePeriod).
TERMINATION_DEADLINE = "karpenter.sh/nodeclaim-termination-timestamp"
NODECLAIMS_API = ("karpenter.sh", "v1", "nodeclaims")

NAMESPACE = "lanes-guard"
WORKER_LABEL = ("app", "lanes-worker")
LANE_LABEL = "lanes.sandboxctl.dev/lane"
OWNER_LABEL = "lanes.sandboxctl.dev/guard-owner"
UNREACHABLE_KUBELET = "lanes.sandboxctl.dev/unreachable-kubelet"  # a finalizer
PLACEHOLDER_LABEL = "lanes.sandboxctl.dev/placeholder"  # value: the NodePool it fills
DRIFT_ANNOTATION = "lanes.sandboxctl.dev/drift"  # in a NodePool's template: a Drift
CRD = "CustomResourceDefinition"
_NODEPOOLS = (NODEPOOLS.group, NODEPOOLS.version, NODEPOOLS.plural)  # the custom API's arguments
CLI_TIMEOUT = 180.0  # a CLI run imports the Kubernetes client: slow on a loaded machine
CALL_TIMEOUT = 10.0


@dataclass(frozen=True)
class GuardWindows:
    """The guard's timing in the lanes; every guard bound derives from these.

    ``tick``: each guard's ``--interval`` (it polls the busy source and reconciles this
    often). ``delivery``: what a change may take beyond the tick on a loaded CI machine (a
    watch event, a PATCH, the lane's 0.1 s poll); the lanes also count the ticks, which
    load does not stretch. ``drain_slack`` and ``worker_grace``: the Terminating
    worker's ``--drain-slack`` and ``terminationGracePeriodSeconds``. ``fail_threshold``:
    ``--probe-fail-threshold``."""

    tick: float = 1.0
    delivery: float = 1.0
    drain_slack: float = 2.0
    worker_grace: int = 3
    fail_threshold: int = 2

    @property
    def within_tick(self) -> float:
        return self.tick + self.delivery


@dataclass(frozen=True)
class Completed:
    """A ``guard-workers`` CLI run: exit code, stdout, stderr."""

    code: int
    stdout: str
    stderr: str


class Guard(Protocol):
    """One ``guard-workers run``, spawned; :meth:`ready` once its caches synced."""

    name: str
    url: str  # /status, /metrics, /healthz

    def ready(self, timeout: float) -> None:
        """Wait until it answers /healthz (synced); one line and its log's tail if not."""
        ...

    def stop(self) -> None: ...

    def kill(self) -> None:
        """SIGKILL: the instance dies without a word (a failover)."""
        ...

    def status(self) -> dict[str, Any]: ...

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float: ...


class GuardKit(Protocol):
    windows: GuardWindows
    namespace: str

    def nodepool(self, name: str, grace: str | None) -> None:
        """A Karpenter NodePool; ``grace`` its terminationGracePeriod (None: unset)."""
        ...

    def node(self, name: str, nodepool: str) -> None: ...

    def pod(
        self,
        name: str,
        lane: str,
        node: str,
        *,
        owner: str = "",
        held: bool = False,
        grace: int | None = None,
    ) -> None:
        """A worker pod of ``lane`` on ``node`` (idle), labelled ``OWNER_LABEL=owner`` when
        given; ``held``: a finalizer keeps it Terminating past its grace, as an unreachable
        kubelet would; ``grace``: its terminationGracePeriodSeconds (default: the windows'
        ``worker_grace`` when held, else 600)."""
        ...

    def set_busy(self, pod: str, busy: bool) -> None: ...

    def set_unresponsive(self, pod: str) -> None: ...

    def polls(self, guard: str) -> int:
        """Reads of the sessions endpoint by ``guard`` so far (one per tick)."""
        ...

    def annotation(self, pod: str) -> str | None:
        """The pod's ``karpenter.sh/do-not-disrupt`` as the API server has it."""
        ...

    def get_pod(self, pod: str) -> dict[str, Any] | None: ...

    def human_edit(self, pod: str, value: str | None) -> None:
        """A person sets (or, with None, removes) the pod's annotation by hand."""
        ...

    def delete_pod(self, pod: str, grace: int) -> None: ...

    def adopt(self, pods: list[str], owner: str, taken_from: str) -> int:
        """Relabel ``pods`` to ``OWNER_LABEL=owner`` from ``taken_from`` (conditional, as
        ``guard-workers adopt`` does); how many were adopted."""
        ...

    def spawn_guard(self, name: str, lane: str, flags: list[str]) -> Guard:
        """``guard-workers run`` over ``lane``'s pods on the kit's tick, not waited for."""
        ...

    def busy_sessions(self, guard: str) -> str:
        """The ``--busy-source`` flag for ``guard`` reading the workers' sessions."""
        ...

    def busy_probes(self) -> str:
        """The ``--busy-source`` flag probing each worker."""
        ...

    def cli(self, *args: str) -> Completed:
        """``sandboxctl guard-workers ARGS --kubeconfig ...`` run to its end."""
        ...

    def selector(self, lane: str) -> str: ...


@dataclass(frozen=True)
class Deletion:
    """A pod's deletion as the API server first recorded it."""

    timestamp: str  # metadata.deletionTimestamp, RFC 3339
    grace: int  # metadata.deletionGracePeriodSeconds


@dataclass(frozen=True)
class KarpenterWindows:
    """The timing of the lanes where Karpenter's own controllers act.

    ``hold``: how long a busy node must be seen kept, longer than Karpenter's disruption
    pass (``disruption_poll``, a constant of Karpenter's disruption controller) so at least
    one pass saw it; ``node_grace`` and ``pod_grace``: the bounded NodePool's
    terminationGracePeriod and its busy worker's terminationGracePeriodSeconds;
    ``idle_grace``: the guard's ``--idle-grace``; ``slack``: what the issue allows a
    bounded hold beyond its grace; ``provision``: pending pods to initialized nodes."""

    hold: float = 12.0
    disruption_poll: float = 10.0
    consolidation_validation: float = 15.0  # Karpenter's wait before a consolidation acts
    node_grace: int = 15
    pod_grace: int = 5
    idle_grace: float = 2.0
    slack: float = 30.0
    provision: float = 60.0
    deadline_skew: float = 2.0  # seconds the pod's deletion may stray from the node's deadline


class KarpenterKit(GuardKit, Protocol):
    """The guard facet on a control plane where Karpenter (its kwok provider) runs: NodePools
    it acts on, nodes it makes for pending pods, Drifts, and its NodeClaims to read."""

    karpenter: KarpenterWindows

    def karpenter_nodepool(
        self, name: str, *, grace: str | None, policy: str, consolidate_after: str
    ) -> None:
        """A NodePool of the kwok provider's node class with a 100 % budget."""
        ...

    def place(self, nodepool: str, count: int) -> None:
        """``count`` pending placeholder pods that each need a node of ``nodepool`` of their
        own (required anti-affinity), so Karpenter makes ``count`` nodes."""
        ...

    def unplace(self, nodepool: str) -> None:
        """Delete ``nodepool``'s placeholders at once."""
        ...

    def initialized_nodes(self, nodepool: str) -> list[str]:
        """Nodes of ``nodepool``'s NodeClaims whose Initialized condition is True."""
        ...

    def nodeclaims(self, nodepool: str) -> list[dict[str, Any]]: ...

    def node_taints(self, node: str) -> list[str] | None:
        """The node's taint keys; None when it is gone."""
        ...

    def pool_nodes(self, nodepool: str) -> list[str]:
        """The Nodes labelled ``karpenter.sh/nodepool=nodepool``."""
        ...

    def drift(self, nodepool: str, mark: str) -> None:
        """Change ``nodepool``'s template (an annotation), which drifts its NodeClaims."""
        ...

    def watch_deletion(self, pod: str, seconds: float) -> Callable[[], Deletion | None]:
        """Watch ``pod`` for ``seconds``; the getter gives the first deletion seen (kwok,
        having no kubelet, deletes a deleted pod again at once with no grace, which moves
        its deletionTimestamp to that moment: only a watch sees the first one)."""
        ...


class RunningGuard:
    def __init__(self, name: str, process: Process, url: str) -> None:
        self.name = name
        self.process = process
        self.url = url

    def ready(self, timeout: float) -> None:
        self.process.ready(timeout)

    def kill(self) -> None:
        self.process.stop(signal.SIGKILL)

    def stop(self) -> None:
        self.process.stop()

    def status(self) -> dict[str, Any]:
        document: dict[str, Any] = httpx.get(f"{self.url}/status", timeout=5).json()
        return document

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        text = httpx.get(f"{self.url}/metrics", timeout=5).text
        matching = (s for s in samples(text, name) if labels is None or s.labels == labels)
        found = next(matching, None)
        return 0.0 if found is None else float(found.value)  # absent: not yet incremented


class LocalGuardKit:
    """The guard facet over a kubeconfig (the local kit's control plane)."""

    def __init__(
        self, kubeconfig: Path, workdir: Path, windows: GuardWindows | None = None
    ) -> None:
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.windows = windows or GuardWindows()
        self.karpenter = KarpenterWindows()
        self.namespace = NAMESPACE
        self.api = api_client(kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.pods = Pods(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.signals = WorkerSignals()
        self.guards: list[RunningGuard] = []
        self.made: dict[str, list[str]] = {"pods": [], "nodes": [], "nodepools": []}

    @classmethod
    @contextmanager
    def open(cls, kubeconfig: Path, windows: GuardWindows | None = None) -> Iterator[LocalGuardKit]:
        with tempfile.TemporaryDirectory(prefix="sandboxctl-lanes-guard-") as workdir:
            kit = cls(kubeconfig, Path(workdir), windows)
            try:
                kit.register_karpenter()
                kit.ensure_namespace()
                yield kit
            finally:
                kit.close()

    # --- the cluster ----------------------------------------------------------------------

    def register_karpenter(self) -> None:
        """Karpenter's CRDs, through the API (a control plane that has them keeps its own)."""
        extensions = client.ApiextensionsV1Api(self.api)
        if not any(KARPENTER_CRDS.glob("*.yaml")):
            raise LaneError(f"Karpenter's CRDs are not in {KARPENTER_CRDS}: run `make kube-tools`")
        for path in sorted(KARPENTER_CRDS.glob("*.yaml")):
            for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
                if not isinstance(document, dict) or document.get("kind") != CRD:
                    continue
                try:
                    # The client serialises a plain dict as it is; its model would drop
                    # nothing but costs a conversion of a long schema.
                    extensions.create_custom_resource_definition(cast(Any, document))
                except ApiException as error:
                    if error.status != 409:
                        raise LaneError(
                            f"cannot register Karpenter's CRDs: {error.status} {error.reason}"
                        ) from None

    def ensure_namespace(self) -> None:
        """The kit's namespace (a real API server refuses pods in one that does not exist)."""
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}}
        try:
            self.core.create_namespace(cast(Any, body))
        except ApiException as error:
            if error.status != 409:
                raise LaneError(
                    f"cannot create namespace {self.namespace}: {error.reason}"
                ) from None

    def nodepool(self, name: str, grace: str | None) -> None:
        template: dict[str, Any] = {
            "nodeClassRef": KWOK_NODECLASS,
            "requirements": [],  # Karpenter's schema requires the list, empty or not
            "expireAfter": "720h",
        }
        if grace is not None:
            template["terminationGracePeriod"] = grace
        body = {
            "apiVersion": NODEPOOLS.api_version,
            "kind": NODEPOOLS.kind,
            "metadata": {"name": name},
            "spec": {
                "template": {"spec": template},
                "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "0s"},
            },
        }
        create = partial(self.custom.create_cluster_custom_object, *_NODEPOOLS, body)
        self._create("nodepools", name, create)

    def node(self, name: str, nodepool: str) -> None:
        body = client.V1Node(
            metadata=client.V1ObjectMeta(name=name, labels={NODEPOOL_LABEL: nodepool})
        )
        self._create("nodes", name, partial(self.core.create_node, body))

    def pod(
        self,
        name: str,
        lane: str,
        node: str,
        *,
        owner: str = "",
        held: bool = False,
        grace: int | None = None,
    ) -> None:
        labels = {WORKER_LABEL[0]: WORKER_LABEL[1], LANE_LABEL: lane}
        if grace is None:
            grace = self.windows.worker_grace if held else 600
        if owner:
            labels[OWNER_LABEL] = owner
        body = client.V1Pod(
            metadata=client.V1ObjectMeta(
                name=name, labels=labels, finalizers=[UNREACHABLE_KUBELET] if held else None
            ),
            spec=client.V1PodSpec(
                node_name=node,
                termination_grace_period_seconds=grace,
                containers=[client.V1Container(name="worker", image="lanes-worker")],
            ),
        )
        self.signals.set_busy(name, False)
        self._create("pods", name, partial(self.core.create_namespaced_pod, self.namespace, body))
        status = {"status": {"phase": "Running", "podIP": "127.0.0.1"}}
        self.core.patch_namespaced_pod_status(
            name, self.namespace, status, _content_type=MERGE_PATCH
        )

    def _create(self, kind: str, name: str, create: Callable[[], object]) -> None:
        try:
            create()
        except ApiException as error:
            raise LaneError(f"cannot create {kind} {name}: {error.status} {error.reason}") from None
        self.made[kind].append(name)

    def get_pod(self, pod: str) -> dict[str, Any] | None:
        try:
            return self.pods.get(self.namespace, pod, CALL_TIMEOUT)
        except KubeNotFound:
            return None

    def annotation(self, pod: str) -> str | None:
        found = self.get_pod(pod)
        if found is None:
            return None
        value: str | None = (found["metadata"].get("annotations") or {}).get(ANNOTATION)
        return value

    def human_edit(self, pod: str, value: str | None) -> None:
        body = {"metadata": {"annotations": {ANNOTATION: value}}}
        self.pods.patch(self.namespace, pod, body, CALL_TIMEOUT)

    def adopt(self, pods: list[str], owner: str, taken_from: str) -> int:
        outcomes = [
            adopt(self.pods, self.namespace, pod, OWNER_LABEL, owner, expected=taken_from)
            for pod in pods
        ]
        return sum(isinstance(outcome, Adopted) for outcome in outcomes)

    def delete_pod(self, pod: str, grace: int) -> None:
        self.core.delete_namespaced_pod(pod, self.namespace, grace_period_seconds=grace)

    # --- Karpenter ------------------------------------------------------------------------

    def karpenter_nodepool(
        self, name: str, *, grace: str | None, policy: str, consolidate_after: str
    ) -> None:
        template: dict[str, Any] = {
            "nodeClassRef": KWOK_NODECLASS,
            "requirements": [],
            "expireAfter": "Never",
        }
        if grace is not None:
            template["terminationGracePeriod"] = grace
        body = {
            "apiVersion": NODEPOOLS.api_version,
            "kind": NODEPOOLS.kind,
            "metadata": {"name": name},
            "spec": {
                "template": {"metadata": {"annotations": {DRIFT_ANNOTATION: "0"}},
                             "spec": template},
                "disruption": {
                    "consolidationPolicy": policy,
                    "consolidateAfter": consolidate_after,
                    "budgets": [{"nodes": "100%"}],
                },
            },
        }  # fmt: skip
        create = partial(self.custom.create_cluster_custom_object, *_NODEPOOLS, body)
        self._create("nodepools", name, create)

    def place(self, nodepool: str, count: int) -> None:
        labels = {PLACEHOLDER_LABEL: nodepool}
        apart = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": labels},
                     "topologyKey": "kubernetes.io/hostname"}
                ]
            }
        }  # fmt: skip
        for index in range(count):
            name = f"{nodepool}-placeholder-{index}"
            body = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "nodeSelector": {NODEPOOL_LABEL: nodepool},
                    "affinity": apart,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "placeholder", "image": "lanes-placeholder"}],
                },
            }
            create = partial(self.core.create_namespaced_pod, self.namespace, cast(Any, body))
            self._create("pods", name, create)

    def unplace(self, nodepool: str) -> None:
        for name in [p for p in self.made["pods"] if p.startswith(f"{nodepool}-placeholder-")]:
            self._gone(self.core.delete_namespaced_pod, name, self.namespace,
                       grace_period_seconds=0)  # fmt: skip

    def nodeclaims(self, nodepool: str) -> list[dict[str, Any]]:
        listed = cast(
            dict[str, Any],
            self.custom.list_cluster_custom_object(
                *NODECLAIMS_API, label_selector=f"{NODEPOOL_LABEL}={nodepool}"
            ),
        )
        return list(listed.get("items") or [])

    def initialized_nodes(self, nodepool: str) -> list[str]:
        return sorted(
            claim["status"]["nodeName"]
            for claim in self.nodeclaims(nodepool)
            if has_condition(claim, "Initialized") and (claim.get("status") or {}).get("nodeName")
        )

    def node_taints(self, node: str) -> list[str] | None:
        try:
            found = self.core.read_node(node)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return [t.key for t in ((found.spec and found.spec.taints) or [])]

    def pool_nodes(self, nodepool: str) -> list[str]:
        listed = self.core.list_node(label_selector=f"{NODEPOOL_LABEL}={nodepool}")
        return sorted(str(n.metadata.name) for n in listed.items if n.metadata)

    def drift(self, nodepool: str, mark: str) -> None:
        body = {"spec": {"template": {"metadata": {"annotations": {DRIFT_ANNOTATION: mark}}}}}
        self.custom.patch_cluster_custom_object(*_NODEPOOLS, nodepool, body)

    def watch_deletion(self, pod: str, seconds: float) -> Callable[[], Deletion | None]:
        found: list[Deletion] = []
        start = self.core.read_namespaced_pod(pod, self.namespace)
        version = start.metadata.resource_version if start.metadata else None

        def follow() -> None:
            stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                self.core.list_namespaced_pod, self.namespace,
                field_selector=f"metadata.name={pod}", resource_version=version,
                timeout_seconds=int(seconds) + 1,
            )  # fmt: skip
            deadline = time.monotonic() + seconds
            for event in stream:
                meta = event["object"].metadata
                if meta is not None and meta.deletion_timestamp is not None:
                    when = meta.deletion_timestamp.strftime("%Y-%m-%dT%H:%M:%SZ")
                    found.append(Deletion(when, int(meta.deletion_grace_period_seconds or 0)))
                    return
                if time.monotonic() > deadline:
                    return

        threading.Thread(target=follow, name=f"watch-{pod}", daemon=True).start()
        return lambda: found[0] if found else None

    # --- the workers' busy signal --------------------------------------------------------

    def set_busy(self, pod: str, busy: bool) -> None:
        self.signals.set_busy(pod, busy)

    def set_unresponsive(self, pod: str) -> None:
        self.signals.set_unresponsive(pod)

    def polls(self, guard: str) -> int:
        return self.signals.polls(guard)

    # --- guard-workers --------------------------------------------------------------------

    def selector(self, lane: str) -> str:
        return f"{WORKER_LABEL[0]}={WORKER_LABEL[1]},{LANE_LABEL}={lane}"

    def busy_sessions(self, guard: str) -> str:
        return f"--busy-source=sessions={self.signals.sessions_url(guard)}"

    def busy_probes(self) -> str:
        return f"--busy-source=probe={self.signals.probe_template}"

    def spawn_guard(self, name: str, lane: str, flags: list[str]) -> Guard:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        args = [
            "guard-workers", "run", f"--kubeconfig={self.kubeconfig}",
            f"--namespace={self.namespace}", f"--selector={self.selector(lane)}",
            f"--interval={self.windows.tick:g}s", f"--listen=127.0.0.1:{port}", *flags,
        ]  # fmt: skip
        guard = RunningGuard(name, Process(name, args, f"{url}/healthz", self.workdir), url)
        guard.process.spawn()
        self.guards.append(guard)
        return guard

    def cli(self, *args: str) -> Completed:
        command = [sys.executable, "-m", "sandboxctl", "guard-workers", *args,
                   f"--kubeconfig={self.kubeconfig}"]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=CLI_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise LaneError(
                f"guard-workers {args[0]} did not end within {CLI_TIMEOUT:.0f} s"
            ) from None
        return Completed(done.returncode, done.stdout, done.stderr)

    # --- teardown -------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every guard, then remove the pods (finalizers first), nodes and NodePools
        this kit made, so the next scenario finds the control plane as it was."""
        actions: list[Callable[[], None]] = [guard.stop for guard in self.guards]
        actions += [partial(self._remove_pod, pod) for pod in self.made["pods"]]
        actions += [partial(self._gone, self.core.delete_node, node) for node in self.made["nodes"]]
        actions += [
            partial(self._gone, self.custom.delete_cluster_custom_object, *_NODEPOOLS, pool)
            for pool in self.made["nodepools"]
        ]
        # Karpenter's NodeClaims of those pools (it terminates their nodes, when it runs).
        actions += [partial(self._remove_claims, pool) for pool in self.made["nodepools"]]
        actions += [self.signals.close, self.api.close]
        error = first_error(actions)
        if error is not None:
            raise LaneError(f"guard lanes' teardown: {error}")

    def _remove_pod(self, pod: str) -> None:
        if self.get_pod(pod) is None:
            return
        self.pods.patch(self.namespace, pod, {"metadata": {"finalizers": None}}, CALL_TIMEOUT)
        self._gone(self.core.delete_namespaced_pod, pod, self.namespace, grace_period_seconds=0)

    def _remove_claims(self, nodepool: str) -> None:
        try:
            claims = self.nodeclaims(nodepool)
        except ApiException as error:
            if error.status == 404:  # no NodeClaim API: nothing of Karpenter's to remove
                return
            raise
        for claim in claims:
            name = claim["metadata"]["name"]
            self._gone(self.custom.delete_cluster_custom_object, *NODECLAIMS_API, name)

    @staticmethod
    def _gone(call: Callable[..., object], *args: Any, **options: Any) -> None:
        """``call``, where a 404 (already gone) is what was wanted."""
        try:
            call(*args, **options)
        except ApiException as error:
            if error.status != 404:
                raise


def audit_document(completed: Completed) -> dict[str, Any] | None:
    """The NodePoolAudit document of an ``audit-nodepools -o json`` run, if it printed one."""
    try:
        document: dict[str, Any] = json.loads(completed.stdout)
    except ValueError:
        return None
    return document

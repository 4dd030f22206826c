"""Karpenter's kwok cloud provider (``karpenter-kwok``, built from ``sigs.k8s.io/karpenter/kwok``)
run against a :class:`ControlPlane`: Karpenter's own controllers provision, drift, consolidate
and terminate NodeClaims whose Nodes the provider writes itself and kwok then runs.

The plane must have Karpenter's CRDs (``KARPENTER_CRDS``), kube-scheduler (Karpenter acts only
on pods the scheduler found Unschedulable) and kwok. Karpenter runs as the plane's admin, with
leader election off (one instance), its metrics and health probes on free ports, and a short
provisioning batch so a pending pod gets its node in about a second.

Karpenter binds its two ports on every address (its options name a port, not an address);
nothing answers on them but its metrics and probes.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client

from sandboxctl.lanes.guardkit import KARPENTER_CRDS
from sandboxctl.lanes.processes import Process, free_port
from sandboxctl_testing.controlplane.plane import ControlPlane
from sandboxctl_testing.controlplane.tools import Tools

PROGRAM = "karpenter-kwok"
READY_TIMEOUT = 90.0  # its caches sync over every kind it watches
NODECLASS_API = ("karpenter.kwok.sh", "v1alpha1", "kwoknodeclasses")
#: The provider's node class a NodePool names in ``spec.template.spec.nodeClassRef``.
NODECLASS = "default"
NODECLASS_REF = {"group": NODECLASS_API[0], "kind": "KWOKNodeClass", "name": NODECLASS}


class Karpenter:
    """``karpenter-kwok`` as a child of the test, its log ``LOGDIR/karpenter-kwok.log``.

    ``start()`` returns once its ``/readyz`` answers 200 (caches synced, Karpenter's CRDs
    mapped) and the KWOKNodeClass ``NODECLASS`` exists and is Ready: the kwok provider has
    no controller of its own that would mark a node class Ready, and Karpenter provisions
    only for NodePools whose node class is."""

    def __init__(
        self,
        plane: ControlPlane,
        logdir: Path,
        *,
        crds: Path = KARPENTER_CRDS,
        tools: Tools | None = None,
        log_level: str = "info",
    ) -> None:
        self.plane = plane
        self.crds = crds
        self.metrics_port = free_port()
        self.health_port = free_port()
        program = (tools or plane.tools).path(PROGRAM)
        env = shutil.which("env")
        assert env is not None
        # Process runs a program with the test's environment; Karpenter reads its kubeconfig
        # only from $KUBECONFIG (its flag set has no --kubeconfig), so env(1) sets it.
        args = [
            f"KUBECONFIG={plane.kubeconfig}",
            str(program),
            f"--metrics-port={self.metrics_port}",
            f"--health-probe-port={self.health_port}",
            "--disable-leader-election=true",
            f"--log-level={log_level}",
            "--batch-idle-duration=500ms",
            "--batch-max-duration=2s",
        ]
        self.process = Process(
            PROGRAM, args, "", logdir, program=Path(env), ready_check=self._ready
        )

    def _ready(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.health_port}/readyz"
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def start(self, timeout: float = READY_TIMEOUT) -> Karpenter:
        self.install_crds()
        self.ensure_nodeclass()
        self.process.spawn()
        try:
            self.process.ready(timeout)
        except BaseException:
            self.process.stop()
            raise
        return self

    def stop(self) -> None:
        self.process.stop()

    def __enter__(self) -> Karpenter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text

    def install_crds(self) -> list[str]:
        """Karpenter's CRDs (``crds``) applied and Established, as its chart installs them
        before the controller starts; their names."""
        if not any(self.crds.glob("*.yaml")):
            raise FileNotFoundError(f"no CRDs in {self.crds}: run `make kube-tools`")
        return self.plane.apply_crds(self.crds)

    def ensure_nodeclass(self) -> None:
        """The KWOKNodeClass ``NODECLASS``, created if missing, its Ready condition True."""
        api = self.plane.api()
        try:
            custom = client.CustomObjectsApi(api)
            body = {
                "apiVersion": f"{NODECLASS_API[0]}/{NODECLASS_API[1]}",
                "kind": "KWOKNodeClass",
                "metadata": {"name": NODECLASS},
            }
            try:
                custom.create_cluster_custom_object(*NODECLASS_API, body)
            except client.ApiException as error:
                if error.status != 409:
                    raise
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            ready: dict[str, Any] = {
                "type": "Ready", "status": "True", "reason": "Ready", "message": "",
                "lastTransitionTime": now,
            }  # fmt: skip
            custom.patch_cluster_custom_object_status(
                *NODECLASS_API, NODECLASS, {"status": {"conditions": [ready]}}
            )
        finally:
            api.close()  # type: ignore[no-untyped-call]

    def delete_nodeclass(self) -> None:
        api = self.plane.api()
        try:
            client.CustomObjectsApi(api).delete_cluster_custom_object(*NODECLASS_API, NODECLASS)
        except client.ApiException as error:
            if error.status != 404:
                raise
        finally:
            api.close()  # type: ignore[no-untyped-call]

    def tail(self) -> str:
        return self.process.tail()

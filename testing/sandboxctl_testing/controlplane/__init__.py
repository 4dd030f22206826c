"""A real Kubernetes control plane for tests and the lanes' local kit, started the way
controller-runtime's envtest starts one: etcd and kube-apiserver (RBAC, client-certificate
users, the aggregation layer's front-proxy certificates) on loopback, and where a test
needs them kube-scheduler, kube-controller-manager and kwok (fake nodes whose pods run).
The programs are those ``make kube-tools`` builds from the Go modules pinned under
``tools/``; without them, :class:`MissingTools` says how to get them."""

from __future__ import annotations

from sandboxctl_testing.controlplane.plane import ControlPlane, running
from sandboxctl_testing.controlplane.tools import MissingTools, Tools

__all__ = ["ControlPlane", "MissingTools", "Tools", "running"]

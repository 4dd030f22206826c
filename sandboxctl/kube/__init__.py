"""The Kubernetes layer: everything sandboxctl says to a Kubernetes API server goes
through here, on the official ``kubernetes`` client.

Modules: ``connect`` (an ``ApiClient`` from a kubeconfig or the pod's service account),
``errors`` (the client's exceptions mapped to one error tree), ``resources`` (typed calls
on the custom resources sandboxctl reads and writes, named in ``core.names``),
``corekinds`` (the same calls on pods and nodes, and the pod writes), ``informer`` (one
list-then-watch cache) and ``lease`` (Lease-based leader election). No business rules
live here: what an inventory means is ``core``'s, what the driver does is the API
server's.
"""

from sandboxctl.core.names import (
    NODE_INVENTORIES,
    NODECLAIMS,
    NODEPOOLS,
    SANDBOX_TEMPLATES,
    SANDBOX_WARM_POOLS,
    Resource,
)
from sandboxctl.kube.connect import api_client
from sandboxctl.kube.corekinds import NODES, PODS, CoreObjects, PodCalls, Pods
from sandboxctl.kube.errors import (
    KubeConflict,
    KubeError,
    KubeExpired,
    KubeForbidden,
    KubeInvalid,
    KubeNotFound,
    KubeUnavailable,
)
from sandboxctl.kube.informer import Informer
from sandboxctl.kube.lease import LeaderElector
from sandboxctl.kube.resources import CustomObjects

__all__ = [
    "NODECLAIMS",
    "NODEPOOLS",
    "NODES",
    "NODE_INVENTORIES",
    "PODS",
    "SANDBOX_TEMPLATES",
    "SANDBOX_WARM_POOLS",
    "CoreObjects",
    "CustomObjects",
    "Informer",
    "KubeConflict",
    "KubeError",
    "KubeExpired",
    "KubeForbidden",
    "KubeInvalid",
    "KubeNotFound",
    "KubeUnavailable",
    "LeaderElector",
    "PodCalls",
    "Pods",
    "Resource",
    "api_client",
]

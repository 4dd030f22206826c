"""Every API name sandboxctl serves, reads or writes, written once.

Each Kubernetes resource is one :class:`Resource` (group, version, kind, plural, short
names); the model, the Kubernetes client layer, the Sandbox API's discovery and the CLI's
documents all read these. The manifests (``manifests/crds``) declare the same names, and
a test holds them to this catalog.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        """``group/version``, as an object's ``apiVersion`` says it."""
        return f"{self.group}/{self.version}"

    @property
    def qualified(self) -> str:
        """``plural.group``, as a Status message names the resource."""
        return f"{self.plural}.{self.group}"

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"


# Served by the Sandbox API (apiserver/kube.py), synthesized from inventories.
SANDBOXES: Final = Resource(
    "agents.x-k8s.io",
    "v1beta1",
    "sandboxes",
    "Sandbox",
    namespaced=True,
    singular="sandbox",
    short_names=("sbx",),
)
# Published by every host (publisher/), read by the kube inventory source.
NODE_INVENTORIES: Final = Resource(
    "sandbox.cocoonstack.io", "v1beta1", "nodeinventories", "NodeInventory", namespaced=False
)
# Read by the warm-pool driver (apiserver/warmpool.py).
SANDBOX_WARM_POOLS: Final = Resource(
    "extensions.agents.x-k8s.io", "v1beta1", "sandboxwarmpools", "SandboxWarmPool", namespaced=True
)
SANDBOX_TEMPLATES: Final = Resource(
    "extensions.agents.x-k8s.io", "v1beta1", "sandboxtemplates", "SandboxTemplate", namespaced=True
)
# Karpenter's, which the guard reads.
NODEPOOLS: Final = Resource("karpenter.sh", "v1", "nodepools", "NodePool", namespaced=False)
NODECLAIMS: Final = Resource("karpenter.sh", "v1", "nodeclaims", "NodeClaim", namespaced=False)

# The documents the CLI prints (inventory reports, guard status and adoption): not served
# by any API server, so only their apiVersion.
REPORTS_API_VERSION: Final = "sandboxctl.dev/v1"

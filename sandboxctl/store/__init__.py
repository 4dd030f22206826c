"""The one store over an InventorySource: Sandbox objects to list, get, watch, claim and
release, for every API that serves them (the Kubernetes-style API, e2b, the envd proxy).

Modules: ``store`` (the store and its queries), ``index`` (the owning-node index),
``nodes`` (calls to host agents: claim routing and live lookups), ``watch`` (watchers),
``errors``.
"""

from sandboxctl.store.errors import NodeRefused, NotFound, StoreError
from sandboxctl.store.store import Assignment, Query, SandboxStore

__all__ = ["Assignment", "NodeRefused", "NotFound", "Query", "SandboxStore", "StoreError"]

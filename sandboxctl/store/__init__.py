"""The one store over an InventorySource: Sandbox objects to list, get, watch, claim and
release, for every API that serves them (the Kubernetes-style API, e2b, the envd proxy).

Modules: ``store`` (``SandboxStore``: the two parts below, as one object), ``reads``
(``FleetReads``: the snapshot with this server's writes, the ledger, lists, pages,
watches, templates), ``resolver`` (``OwnerResolver``: which node holds a sandbox, asking
the agents when the reads do not say), ``owners`` (the owners it remembers: one memory,
one policy), ``claims`` (``ClaimRouter``: claims and the verbs on a claimed sandbox),
``nodes`` (calls to host agents),
``query``, ``ledger``, ``overlay``, ``lists``, ``pages``, ``watch``, ``errors``.
"""

from sandboxctl.store.assignment import Assignment
from sandboxctl.store.errors import NodeRefused, NotFound, StoreError
from sandboxctl.store.query import Query
from sandboxctl.store.store import SandboxStore

__all__ = ["Assignment", "NodeRefused", "NotFound", "Query", "SandboxStore", "StoreError"]

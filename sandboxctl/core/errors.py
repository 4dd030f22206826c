"""The sandboxctl exception tree, drawn once, with the status each API answers.

Columns: the agent's API (sandboxd), the Sandbox API and the e2b API (both from the one
table in ``apiserver/errors.py``). "-" means the error never reaches that API; a test walks
every subclass and checks these (tests/core/test_errors.py). Nothing here is a 500.

                                                      agent  Sandbox/e2b
SandboxctlError                                       -      -
├── InvalidValueError        a value that does not parse          400    400
│   ├── UnsupportedFieldError (core.selectors)  a field selector    -      400
│   ├── BadContinue (store.lists)      a continue token we did not give  -  400
│   ├── BadQuery (apiserver.e2b.paging)  an e2b list parameter   -      400
│   ├── WireError (core.wire)  a body that does not fit its shape (names the field) 400  400
│   │   └── NotJson            bytes that are not JSON                            400  400
│   └── BodyRefused (serving.apps)  a request body missing or nested too deeply  400  400
├── ConfigurationError       settings that must not run together  -      503
│   ├── KubeConfigError (kube.errors)  no usable kubeconfig          -      503
│   └── StateCorrupt (sandboxd.state)  the agent's database is unreadable  -  503
│   └── GuardStartError, UnboundedRefusal (guard.service), AuditReadError (guard.karpenter):
│       guard-workers cannot start, may not stamp, may not audit (CLI only)  -  503
│   └── LaneError (lanes.model)  a lane selector, kit or step that cannot run (CLI only)  -  503
│       └── LaneTimeout          a lane's wait reached its bound                 -  503
├── InventoryFormatError     a NodeInventory that breaks the model -     502
├── NoWarmCapacity (core.placement)  no fresh node can take the claim  - 503
├── NoNodeCapacity (core.placement)  every node serving the template is full  -  429
├── AgentApiError (agentapi)  what a call to an agent met           -      502
│   ├── AgentError           the agent answered an error status    -  its 4xx, else 502
│   │   └── InvalidId        an id that cannot be one (no request)  -      404
│   ├── AgentUnreachable     the agent could not be reached        -      502
│   └── AgentAnswerError     an answer that breaks the contract    -      502
├── AgentRefusal (sandboxd.errors)  a request the agent refuses  its status  its 4xx, else 503
│   ├── BadRequest 400, Unauthorized 401, NoSuchSandbox 404, UnknownTemplate 404,
│   └── Conflict 409, PayloadTooLarge 413, AtCapacity 429, StateDirInUse 409
├── RuntimeFailure (sandboxd.runtime)  the runtime could not start or enter  503  503
│   └── NftError (sandboxd.network.nft)  nftables refused a rule    503    503
├── MeshStartError (inventory.mesh)  mesh mode cannot start      -      503
├── KubeStartError (inventory.kube)  the first NodeInventory list did not come  -  503
├── KubeError (kube.errors)  a Kubernetes API call this server made failed  -  502
│   └── KubeUnavailable, KubeNotFound, KubeConflict, KubeExpired, KubeForbidden, KubeInvalid
└── StoreError (store.errors)
    ├── NotFound             no fresh node holds it                -      404
    ├── Expired              a resourceVersion or continue token we no longer hold  410
    ├── NodeRefused          the owning node's 4xx                 -      its 4xx
    ├── NodeUnavailable      the owning node failed or did not answer  -  502
    └── ClaimRoutingOff      no fleet token to reach the nodes     -      503

Each message is written for the person who must fix the input. The CLI prints it as one
line and exits 2; the API servers map it to a status code at their boundary.
"""

from __future__ import annotations


class SandboxctlError(Exception):
    """Root of every error sandboxctl raises on purpose."""


class InvalidValueError(SandboxctlError, ValueError):
    """A value (duration, timestamp, key) that does not parse."""


class ConfigurationError(SandboxctlError):
    """Settings that each parse but must not be used together, e.g. an unsafe window."""


class InventoryFormatError(SandboxctlError):
    """A NodeInventory object that breaks the model.

    ``where`` names the object (file and position, when known) and ``field`` the dotted
    path inside it, so the message points at the exact place to fix.
    """

    def __init__(self, field: str, problem: str, where: str = "") -> None:
        self.field = field
        self.problem = problem
        self.where = where
        super().__init__(self._render())

    def located(self, where: str) -> InventoryFormatError:
        """The same error, prefixed with where the object came from."""
        prefix = f"{where}: {self.where}" if self.where else where
        return InventoryFormatError(self.field, self.problem, prefix)

    def _render(self) -> str:
        place = f"{self.where}: " if self.where else ""
        field = f"{self.field}: " if self.field else ""
        return f"{place}{field}{self.problem}"

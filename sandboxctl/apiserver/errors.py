"""The one table from sandboxctl's errors to the HTTP status the API servers answer.

Both the Sandbox API (a Kubernetes ``Status``) and the e2b API (``{code, message}``) ask
:func:`status_of`; each dresses the answer in its own body. The tree it covers is drawn in
``sandboxctl.core.errors``. Nothing sandboxctl raises on purpose is a 500: a 500 means a
bug, and its traceback is logged.
"""

from __future__ import annotations

from sandboxctl.agentapi import AgentApiError, AgentError
from sandboxctl.core.errors import ConfigurationError, InvalidValueError, InventoryFormatError
from sandboxctl.core.placement import NoNodeCapacity, NoWarmCapacity
from sandboxctl.inventory.kube import KubeStartError
from sandboxctl.inventory.mesh import MeshStartError
from sandboxctl.kube.errors import KubeError
from sandboxctl.sandboxd.errors import AgentRefusal
from sandboxctl.sandboxd.runtime import RuntimeFailure
from sandboxctl.store.errors import (
    ClaimRoutingOff,
    Expired,
    NodeRefused,
    NodeUnavailable,
    NotFound,
)

BAD_GATEWAY = 502  # a node or source failed or answered what we cannot read


def status_of(error: Exception) -> int:
    """The status an error is answered with; 500 only for what is not ours (a bug)."""
    if isinstance(error, NotFound):
        return 404
    if isinstance(error, Expired):
        return 410
    if isinstance(error, InvalidValueError):
        return 400
    if isinstance(error, NodeRefused):
        return _client_error_or(error.status, BAD_GATEWAY)
    if isinstance(error, AgentError):
        return _client_error_or(error.status, BAD_GATEWAY)
    if isinstance(error, NodeUnavailable | AgentApiError | InventoryFormatError | KubeError):
        return BAD_GATEWAY  # KubeError: the control plane failed a call this server made
    if isinstance(error, NoNodeCapacity):
        return 429
    if isinstance(
        error, NoWarmCapacity | ClaimRoutingOff | MeshStartError | KubeStartError | RuntimeFailure
    ):
        return 503
    if isinstance(error, ConfigurationError):
        return 503  # this server is set up wrong: not the client's mistake
    if isinstance(error, AgentRefusal):  # an agent in this process refused
        return _client_error_or(error.status, 503)
    return 500


def _client_error_or(status: int, otherwise: int) -> int:
    return status if 400 <= status < 500 else otherwise

"""Every error sandboxctl raises on purpose has a status on each API it can reach, and
none is a 500: a new error class fails here until it is given one (core/errors.py draws
the tree these rows check)."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

import sandboxctl
from sandboxctl.agentapi import AgentAnswerError, AgentError, AgentUnreachable, InvalidId
from sandboxctl.agentapi.errors import AgentApiError
from sandboxctl.apiserver.e2b.paging import BadQuery
from sandboxctl.apiserver.e2b.service import translate as e2b_error
from sandboxctl.apiserver.status import api_error
from sandboxctl.core.errors import (
    ConfigurationError,
    InvalidValueError,
    InventoryFormatError,
    SandboxctlError,
)
from sandboxctl.core.placement import NoNodeCapacity, NoWarmCapacity
from sandboxctl.core.selectors import UnsupportedFieldError
from sandboxctl.core.wire import NotJson, WireError
from sandboxctl.guard.karpenter import AuditReadError
from sandboxctl.guard.service import GuardStartError, UnboundedRefusal
from sandboxctl.inventory.kube import KubeStartError
from sandboxctl.inventory.mesh import MeshStartError
from sandboxctl.kube.errors import (
    KubeConfigError,
    KubeConflict,
    KubeError,
    KubeExpired,
    KubeForbidden,
    KubeInvalid,
    KubeNotFound,
    KubeUnavailable,
)
from sandboxctl.lanes.model import KitDown, LaneError, LaneTimeout
from sandboxctl.sandboxd import errors as agent
from sandboxctl.sandboxd.api import status_of as agent_status
from sandboxctl.sandboxd.network.nft import NftError
from sandboxctl.sandboxd.runtime import RuntimeFailure
from sandboxctl.sandboxd.state import StateCorrupt
from sandboxctl.serving.apps import BodyRefused
from sandboxctl.store.errors import (
    ClaimRoutingOff,
    Expired,
    NodeRefused,
    NodeUnavailable,
    NotFound,
    StoreError,
)
from sandboxctl.store.lists import BadContinue

# example, the agent API's status (None: never reaches it), the Sandbox and e2b APIs'
EXAMPLES: list[tuple[SandboxctlError, int | None, int]] = [
    (InvalidValueError("bad duration"), 400, 400),
    (UnsupportedFieldError("spec.x", "sandboxes", ("metadata.name",)), None, 400),
    (BadContinue(), None, 400),
    (BadQuery("limit 'x'"), None, 400),
    (WireError("pools[0].warm", "required"), 400, 400),
    (NotJson("", "JSON is malformed"), 400, 400),
    (BodyRefused("a JSON object body is required"), 400, 400),
    (ConfigurationError("unsafe window"), None, 503),
    (InventoryFormatError("entries", "expected a list"), None, 502),
    (NoWarmCapacity("no warm base sandbox"), None, 503),
    (NoNodeCapacity("base", ("n1",)), None, 429),
    (AgentApiError("an agent call failed"), None, 502),
    (AgentError(404, "not found", "n1:7777"), None, 404),
    (AgentError(409, "paused", "n1:7777"), None, 409),
    (AgentError(500, "boom", "n1:7777"), None, 502),
    (InvalidId("a/b", "contains /", "n1:7777"), None, 404),
    (AgentUnreachable("n1:7777", "connection refused", True), None, 502),
    (AgentAnswerError("info.node", "required", "n1:7777"), None, 502),
    (agent.BadRequest("ttl_seconds: negative"), 400, 400),
    (agent.Unauthorized("wrong token"), 401, 401),
    (agent.NoSuchSandbox("sandbox 'x' not found"), 404, 404),
    (agent.UnknownTemplate("template 'x' is not served"), 404, 404),
    (agent.Conflict("paused"), 409, 409),
    (agent.PayloadTooLarge("body over 1 MiB"), 413, 413),
    (agent.AtCapacity("every slot is claimed"), 429, 429),
    (agent.StateDirInUse("another agent holds it"), 409, 409),
    (RuntimeFailure("bwrap failed to start"), 503, 503),
    (MeshStartError("no sandboxd seed answered"), None, 503),
    (KubeStartError("no NodeInventory list in 10 s"), None, 503),
    (KubeConfigError("no kubeconfig"), None, 503),
    (KubeError("list pods", "boom", 500), None, 502),
    (KubeUnavailable("list pods", "no answer"), None, 502),
    (KubeNotFound("get pod", "not found", 404), None, 502),
    (KubeConflict("patch pod", "conflict", 409), None, 502),
    (KubeExpired("watch pods", "too old", 410), None, 502),
    (KubeForbidden("patch pod", "forbidden", 403), None, 502),
    (KubeInvalid("apply", "invalid", 422), None, 502),
    (NftError("nft refused the rule"), 503, 503),
    (StateCorrupt(Path("sandboxd.sqlite"), "not a database"), None, 503),
    (NotFound('sandboxes "x"'), None, 404),
    (Expired(5, 10, 20), None, 410),
    (NodeRefused(409, "paused"), None, 409),
    (NodeUnavailable("timed out"), None, 502),
    (ClaimRoutingOff("no fleet token"), None, 503),
    (GuardStartError("no first read of pods"), None, 503),  # guard-workers: CLI only
    (UnboundedRefusal("refusing to stamp"), None, 503),
    (AuditReadError("may not list nodepools"), None, 503),
    (LaneError("no lane or group 'x'"), None, 503),  # sandboxctl lanes: CLI only
    (LaneTimeout("waited 9.0 s for B to leave"), None, 503),
    (KitDown("the fleet did not answer before the first lane"), None, 503),
]
ABSTRACT = {SandboxctlError, StoreError, agent.AgentRefusal}  # roots, never raised as such


def _every_error_class() -> set[type[SandboxctlError]]:
    for module in pkgutil.walk_packages(sandboxctl.__path__, "sandboxctl."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    found: set[type[SandboxctlError]] = set()
    pending = [SandboxctlError]
    while pending:
        for sub in pending.pop().__subclasses__():
            if sub.__module__.startswith("sandboxctl.") and sub not in found:
                found.add(sub)
                pending.append(sub)
    return found


def test_every_error_class_has_a_row() -> None:
    covered = {type(example) for example, _, _ in EXAMPLES}
    missing = _every_error_class() - covered - ABSTRACT
    assert not missing, f"give these a status and a row here: {sorted(map(str, missing))}"


@pytest.mark.parametrize(("error", "agent_api", "apis"), EXAMPLES, ids=lambda v: type(v).__name__)
def test_each_api_answers_the_documented_status(
    error: SandboxctlError, agent_api: int | None, apis: int
) -> None:
    assert api_error(error).code == apis
    assert e2b_error(error).code == apis
    if agent_api is not None:
        assert agent_status(error) == agent_api
    assert 500 not in (api_error(error).code, e2b_error(error).code, agent_api)

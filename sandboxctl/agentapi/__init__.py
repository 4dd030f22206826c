"""The host agent's HTTP API as one contract: its JSON models, the client, the mapping.

The agent (``sandboxctl.sandboxd``) serves these shapes and everything that calls an
agent (mesh mode, the store, the envd proxy, the CLI) reads them, so each shape is written
once. Modules: ``models`` (one ``core.wire`` shape per JSON body, decoded and encoded
by ``core.wire``), ``network`` (a claim's network policy and its updates), ``ids`` (which
strings can be a sandbox id, and escaping them), ``client`` (the httpx client), ``errors``
(the error tree), ``mapping`` (answers to inventory entries and nodes). No business rules
live here: the agent decides what a claim may ask for, the store where it goes.
"""

from sandboxctl.agentapi.client import AgentClient
from sandboxctl.agentapi.errors import (
    AgentAnswerError,
    AgentApiError,
    AgentError,
    AgentUnreachable,
    InvalidId,
)
from sandboxctl.agentapi.mapping import entry_from_row, inventory_from_agent, pools_from_info
from sandboxctl.agentapi.models import (
    AgentInfo,
    ClaimGrant,
    ClaimRequest,
    LogEvent,
    PoolStatus,
    PoolsUpdate,
    PoolTarget,
    RenewAnswer,
    RenewRequest,
    SandboxList,
    SandboxLog,
    SandboxRow,
    UsageSample,
    UsageSamples,
)

__all__ = [
    "AgentAnswerError",
    "AgentApiError",
    "AgentClient",
    "AgentError",
    "AgentInfo",
    "AgentUnreachable",
    "ClaimGrant",
    "ClaimRequest",
    "InvalidId",
    "LogEvent",
    "PoolStatus",
    "PoolTarget",
    "PoolsUpdate",
    "RenewAnswer",
    "RenewRequest",
    "SandboxList",
    "SandboxLog",
    "SandboxRow",
    "UsageSample",
    "UsageSamples",
    "entry_from_row",
    "inventory_from_agent",
    "pools_from_info",
]

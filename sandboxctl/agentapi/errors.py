"""Errors of the agent API, as its callers see them.

AgentApiError (SandboxctlError)   every failed call to a host agent
├── AgentError                    the agent answered with an error status (``status`` kept)
│   └── InvalidId                 an id no agent gives: refused before any request (404)
├── AgentUnreachable              no answer: refused, timed out, cut off (``undelivered``)
└── AgentAnswerError              JSON that does not fit the API; ``field`` names where

The client translates every httpx error into one of these, chaining the original, so no
caller needs to know the HTTP library.
"""

from __future__ import annotations

from sandboxctl.core.errors import SandboxctlError


class AgentApiError(SandboxctlError):
    """Root of every failed call to a host agent."""


class AgentError(AgentApiError):
    """The agent answered with an error status; ``message`` is its ``error`` text."""

    def __init__(self, status: int, message: str, address: str) -> None:
        self.status = status
        self.message = message
        self.address = address
        super().__init__(f"sandboxd {address}: {status} {message}")


class InvalidId(AgentError):
    """An id that cannot name a sandbox (see :mod:`sandboxctl.agentapi.ids`).

    It is refused before any request, with the 404 the agent would answer: callers that
    treat 404 as "no such sandbox" need no case of their own.
    """

    def __init__(self, sandbox_id: str, problem: str, address: str) -> None:
        self.sandbox_id = sandbox_id
        self.problem = problem
        super().__init__(404, f"sandbox id {_shown(sandbox_id)} {problem}", address)


class AgentUnreachable(AgentApiError):
    """The agent gave no answer: ``reason`` says why, in a few words.

    ``undelivered`` is True only when the request certainly never reached the agent (no
    connection was made), so a claim may safely be tried elsewhere; after a timeout or a
    cut-off answer the agent may have acted on it.
    """

    def __init__(
        self, address: str, reason: str, undelivered: bool, timed_out: bool = False
    ) -> None:
        self.address = address
        self.reason = reason
        self.undelivered = undelivered
        self.timed_out = timed_out  # no answer in time: the agent may only be slow
        super().__init__(f"sandboxd {address}: {reason}")


class AgentAnswerError(AgentApiError):
    """JSON that does not fit the agent's API; ``field`` is the dotted path in it
    (``info.pools[0].warm``, ``sandboxes[3].key.template``).

    Raised for an agent's answer, and by the agent for a request body it cannot read.
    ``address`` names the agent when the caller knows it (see :meth:`at`).
    """

    def __init__(self, field: str, problem: str, address: str = "") -> None:
        self.field = field
        self.problem = problem
        self.address = address
        place = f"sandboxd {address}: " if address else ""
        named = f"{field}: " if field else ""
        super().__init__(f"{place}{named}{problem}")

    def at(self, address: str) -> AgentAnswerError:
        """The same error, naming the agent that gave the answer."""
        return AgentAnswerError(self.field, self.problem, address)


def _shown(sandbox_id: str) -> str:
    """An id for a message: quoted, and cut short (an id may be any length)."""
    return repr(sandbox_id if len(sandbox_id) <= 40 else sandbox_id[:40] + "...")

"""Errors the agent raises, each carrying the HTTP status its API answers with (see the
whole tree in ``sandboxctl.core.errors``)."""

from __future__ import annotations

from sandboxctl.core.errors import SandboxctlError


class AgentRefusal(SandboxctlError):
    """A request the agent refuses; ``status`` is what its API answers."""

    status = 500


class BadRequest(AgentRefusal):
    status = 400


class Unauthorized(AgentRefusal):
    status = 401


class NoSuchSandbox(AgentRefusal):
    status = 404


class UnknownTemplate(AgentRefusal):
    """A claim for a template this agent does not serve."""

    status = 404


class Conflict(AgentRefusal):
    status = 409


class PayloadTooLarge(AgentRefusal):
    status = 413


class AtCapacity(AgentRefusal):
    """Every sandbox slot is claimed; the caller should try another node."""

    status = 429


class StateDirInUse(AgentRefusal):
    """Another agent holds the state directory's lock."""

    status = 409

"""Errors the agent raises, each carrying the HTTP status its API answers with."""

from __future__ import annotations

from sandboxctl.core.errors import SandboxctlError


class AgentError(SandboxctlError):
    status = 500


class BadRequest(AgentError):
    status = 400


class Unauthorized(AgentError):
    status = 401


class NotFound(AgentError):
    status = 404


class Conflict(AgentError):
    status = 409


class PayloadTooLarge(AgentError):
    status = 413


class AtCapacity(AgentError):
    """Every sandbox slot is claimed; the caller should try another node."""

    status = 429


class StateDirInUse(AgentError):
    """Another agent holds the state directory's lock."""

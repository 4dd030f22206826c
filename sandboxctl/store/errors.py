"""Errors the store raises; each API maps them to its own status codes.

StoreError (SandboxctlError)
├── NotFound             no fresh node holds the sandbox (404 on every API)
├── NodeRefused          the owning node answered a 4xx other than 404 (status kept)
├── NodeUnavailable      the owning node could not be reached or failed (502/500)
└── ClaimRoutingOff      the store was built without node access (no fleet token)
NoWarmCapacity (core.placement) is raised by claims when no fresh node has warm capacity.
"""

from __future__ import annotations

from sandboxctl.core.errors import SandboxctlError


class StoreError(SandboxctlError):
    """Root of the store's errors."""


class NotFound(StoreError):
    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(f"{what} not found")


class NodeRefused(StoreError):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(message)


class NodeUnavailable(StoreError):
    """The owning node did not answer, or failed; the request may or may not have landed."""


class ClaimRoutingOff(StoreError):
    """Claims and verbs need the fleet's root token to reach the nodes."""


class Expired(StoreError):
    """A resourceVersion or continue token this server no longer holds, or never gave
    (410 Gone: the client relists)."""

    def __init__(self, version: int, oldest: int | None, current: int) -> None:
        self.version = version
        self.current = current
        if version > current:
            message = f"resource version {version} was not given by this server ({current})"
        else:
            held = f"; the oldest held is {oldest}" if oldest is not None else ""
            message = f"too old resource version: {version} ({current}){held}"
        super().__init__(message)

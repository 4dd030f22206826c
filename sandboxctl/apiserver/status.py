"""Kubernetes ``Status`` bodies, and the one table from sandboxctl errors to them.

Every error the Kubernetes-style API answers is a ``Status`` (``apiVersion: v1``), which
kubectl prints as ``Error from server (<reason>): <message>``:

=================================  ====  ==================
error                              code  reason
=================================  ====  ==================
store NotFound, unknown path        404  NotFound
store Expired (resourceVersion)     410  Expired
InvalidValueError (selectors, ...)  400  BadRequest
ApiError                            its  its
NodeRefused (the node's 4xx)        its  by code (Conflict, ...)
NoWarmCapacity, ClaimRoutingOff     503  ServiceUnavailable
NodeUnavailable                     502  InternalError
anything else                       500  InternalError
=================================  ====  ==================
"""

from __future__ import annotations

from typing import Any, Final

from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.placement import NoWarmCapacity
from sandboxctl.store.errors import (
    ClaimRoutingOff,
    Expired,
    NodeRefused,
    NodeUnavailable,
    NotFound,
)

NOT_FOUND_PATH: Final = "the server could not find the requested resource"

REASONS: Final = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Gone",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    502: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    """An error answered as a Status: ``code``, ``reason``, ``message`` and ``details``."""

    def __init__(
        self,
        code: int,
        message: str,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        self.code = code
        self.message = message
        self.reason = reason or reason_for(code)
        self.details = details or {}
        super().__init__(message)

    def body(self) -> dict[str, Any]:
        return status_body(self.code, self.message, self.reason, self.details)


def reason_for(code: int) -> str:
    if code in REASONS:
        return REASONS[code]
    return "BadRequest" if 400 <= code < 500 else "InternalError"


def status_body(
    code: int, message: str, reason: str | None = None, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or reason_for(code),
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def api_error(error: Exception, details: dict[str, Any] | None = None) -> ApiError:
    """The Status an exception is answered with; ``details`` name the object, if any."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, NotFound):
        return ApiError(404, str(error), details=details)
    if isinstance(error, Expired):
        return ApiError(410, str(error), reason="Expired")
    if isinstance(error, InvalidValueError):
        return ApiError(400, str(error), details=details)
    if isinstance(error, NodeRefused):
        code = error.status if 400 <= error.status < 500 else 502
        return ApiError(code, f"the owning node refused: {error.message}", details=details)
    if isinstance(error, NoWarmCapacity | ClaimRoutingOff):
        return ApiError(503, str(error), details=details)
    if isinstance(error, NodeUnavailable):
        return ApiError(502, str(error) or "the owning node did not answer", details=details)
    return ApiError(500, f"internal error: {type(error).__name__}: {error}", details=details)

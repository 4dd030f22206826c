"""Kubernetes ``Status`` bodies for the Sandbox API.

Every error the Kubernetes-style API answers is a ``Status`` (``apiVersion: v1``), which
kubectl prints as ``Error from server (<reason>): <message>``. Its code comes from the one
table in ``apiserver/errors.py`` (the tree is drawn in ``sandboxctl.core.errors``); the
reason follows the code (``REASONS``), and an expired resourceVersion is ``Expired``.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from sandboxctl.apiserver.errors import status_of
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.serving.apps import HttpError, refusal
from sandboxctl.store.errors import Expired, NodeRefused, NodeUnavailable

log = logging.getLogger("sandboxctl.apiserver")
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


class ApiError(HttpError):
    """An error answered as a Status: ``code``, ``reason``, ``message`` and ``details``."""

    def __init__(
        self,
        code: int,
        message: str,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(code, message)
        self.code = code
        self.reason = reason or reason_for(code)
        self.details = details or {}

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
    """The Status an exception is answered with (its code from ``errors.status_of``);
    ``details`` name the object, if any."""
    if isinstance(error, ApiError):
        return error
    code = status_of(error)
    if isinstance(error, Expired):
        return ApiError(code, str(error), reason="Expired")
    if isinstance(error, NodeRefused):
        return ApiError(code, f"the owning node refused: {error.message}", details=details)
    if isinstance(error, NodeUnavailable):
        # Why names the fleet's own addresses: the log has it, a tenant does not.
        log.warning("a node failed a Sandbox API request: %s", error)
        return ApiError(code, "the owning node is unreachable", details=details)
    if code == 500:
        log.error("unexpected error serving a Sandbox API request", exc_info=error)
        return ApiError(code, f"internal error: {type(error).__name__}", details=details)
    if isinstance(error, InvalidValueError):
        return ApiError(code, refusal(error), details=details)
    return ApiError(code, str(error) or type(error).__name__, details=details)

"""The client's failures as one error tree, so callers decide on kinds, not on codes.

``ApiException`` (an answer) maps by status; urllib3's transport errors (no answer, a
reset, a read timeout) and an answer that is not JSON are :class:`KubeUnavailable`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from sandboxctl.core.errors import ConfigurationError, SandboxctlError

T = TypeVar("T")


class KubeConfigError(ConfigurationError):
    """No usable kubeconfig or service account (one line, exit 2)."""


class KubeError(SandboxctlError):
    """A Kubernetes API call failed. ``status`` is the HTTP status when there was an
    answer; ``reason`` the Status reason (``NotFound``, ``Conflict``...)."""

    def __init__(
        self, what: str, message: str, status: int | None = None, reason: str = ""
    ) -> None:
        super().__init__(f"{what}: {message}" if what else message)
        self.what = what
        self.message = message
        self.status = status
        self.reason = reason

    @property
    def retryable(self) -> bool:
        """Whether trying again later may succeed (the server was away or overloaded)."""
        return False


class KubeUnavailable(KubeError):
    """No answer, a 5xx, or 429: the server is away, failing or shedding load."""

    @property
    def retryable(self) -> bool:
        return True


class KubeNotFound(KubeError):
    """404: the object, or the resource (a CRD not installed)."""


class KubeConflict(KubeError):
    """409: a stale resourceVersion, an existing name, or an apply conflict."""


class KubeExpired(KubeError):
    """410: the resourceVersion is older than the server keeps; relist."""


class KubeForbidden(KubeError):
    """401 or 403: the credentials are refused, or RBAC does not allow the call."""


class KubeInvalid(KubeError):
    """400, 415 or 422: the request itself is wrong; trying again will not help."""


def kube_error(error: BaseException, what: str = "") -> KubeError:
    """The error tree's member for one failure of the client."""
    if isinstance(error, KubeError):
        return error
    if isinstance(error, ApiException):
        status = int(error.status or 0)
        reason, message = _status_body(error)
        kind: type[KubeError]
        if status in (401, 403):
            kind = KubeForbidden
        elif status == 404:
            kind = KubeNotFound
        elif status == 409:
            kind = KubeConflict
        elif status == 410:
            kind = KubeExpired
        elif status in (400, 415, 422):
            kind = KubeInvalid
        else:
            kind = KubeUnavailable
        return kind(what, message, status or None, reason)
    if isinstance(error, (HTTPError, OSError, ValueError)):
        return KubeUnavailable(what, " ".join(f"{type(error).__name__}: {error}".split()))
    return KubeUnavailable(what, f"{type(error).__name__}: {error}")


@contextmanager
def mapped(what: str) -> Iterator[None]:
    """Run a client call; its failures come out as :class:`KubeError`."""
    try:
        yield
    except (ApiException, HTTPError, OSError, ValueError) as error:
        raise kube_error(error, what) from error


def call(what: str, fn: Callable[[], T]) -> T:
    with mapped(what):
        return fn()


def _status_body(error: ApiException) -> tuple[str, str]:
    """(reason, message) from the Status body, else the HTTP reason."""
    try:
        body = json.loads(error.body or "")
    except (TypeError, ValueError):
        body = None
    if isinstance(body, dict) and body.get("kind") == "Status":
        return str(body.get("reason") or ""), str(body.get("message") or error.reason or "")
    return "", f"{error.status} {error.reason or ''}".strip()

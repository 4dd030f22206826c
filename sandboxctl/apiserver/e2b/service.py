"""The e2b API's service: the store, the configuration, and what every route asks of
them (the key's namespace, finding a sandbox, a blocking store call). The routes
(``routes/``) are functions over it; the app (``app.py``) holds one in its state."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated, Any, Final, TypeVar

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError

from sandboxctl.agentapi import SandboxRow
from sandboxctl.apiserver.e2b.auth import Keys
from sandboxctl.apiserver.e2b.config import E2bConfig
from sandboxctl.apiserver.errors import status_of
from sandboxctl.apiserver.templatenames import resolve, template_of
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.ids import SandboxId
from sandboxctl.core.model import PoolKey
from sandboxctl.core.placement import NoNodeCapacity, NoWarmCapacity
from sandboxctl.core.snapshot import Located
from sandboxctl.serving.apps import HttpError, blocking, refusal
from sandboxctl.store import SandboxStore
from sandboxctl.store.errors import ClaimRoutingOff, NodeRefused, NodeUnavailable

log = logging.getLogger("sandboxctl.apiserver.e2b")

T = TypeVar("T")
NO_RETRY: Final = {"Should-Retry": "false"}


class E2bError(HttpError):
    """An error as e2b answers it: ``{"code": <status>, "message": <text>}``, which the
    SDK needs to raise its typed exceptions."""

    @property
    def code(self) -> int:
        return self.status

    def body(self) -> object:
        return {"code": self.status, "message": self.message}


class E2bService:
    """One per app: every route reaches the fleet through it."""

    def __init__(self, store: SandboxStore, config: E2bConfig) -> None:
        self.store = store
        self.config = config
        self.keys = Keys(config.api_keys, config.allow_anonymous, config.namespace)

    async def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """A blocking store call on the thread pool; its errors become e2b's answers."""
        return await blocking(fn, *args, translate=translate, **kwargs)

    async def locate(self, namespace: str, sandbox_id: str) -> Located:
        """The sandbox of the key's namespace that ``sandbox_id`` names (either spelling),
        asking the nodes when this server does not read it yet; 404 otherwise."""
        located = await self.call(self.store.locate_claim, SandboxId.parse(sandbox_id), namespace)
        if located is None:
            raise not_found(sandbox_id)
        return located

    async def read(self, located: Located, sandbox_id: str) -> SandboxRow:
        """The owning node's live row (404 once it is gone there)."""
        try:
            return await self.call(self.store.row_of, located)
        except E2bError as error:
            if error.status == 404:
                raise not_found(sandbox_id) from None
            raise

    def pool_of(self, requested: str) -> PoolKey | None:
        """An alias's pool, else the template's own small pool if a fresh node serves
        it; None when neither (the rule the Sandbox API's create reads too)."""
        found = resolve(requested, self.config.aliases, self.store.has_template)
        return PoolKey(found.template, "none", found.size) if found is not None else None

    def template_of(self, requested: str) -> str:
        """The template an alias names, else the name itself."""
        return template_of(requested, self.config.aliases)


def service(request: Request) -> E2bService:
    found: E2bService = request.app.state.e2b
    return found


def tenant(request: Request) -> str:
    """The namespace of the request's ``X-API-Key``; 401 for a wrong or missing one."""
    namespace = service(request).keys.namespace(request.headers.get("x-api-key"))
    if namespace is None:
        raise E2bError(401, "invalid API key")
    return namespace


# Route parameters: the service, and the namespace the key drives (checked first).
Service = Annotated[E2bService, Depends(service)]
Tenant = Annotated[str, Depends(tenant)]


def not_found(sandbox_id: str) -> E2bError:
    return E2bError(404, f"sandbox {SandboxId.parse(sandbox_id).public!r} not found")


def translate(error: Exception) -> E2bError:
    """What a store call raised, as e2b answers it."""
    if isinstance(error, NodeRefused):
        if error.status == 429:
            return E2bError(429, f"at capacity: {error.message}", NO_RETRY)
        return E2bError(error.status, error.message)
    if isinstance(error, NoNodeCapacity):
        # e2b's answer when a team is at its concurrent-sandbox limit: the SDK raises
        # RateLimitException; Should-Retry: false, since retrying at once will not help.
        return E2bError(429, f"at capacity: {error}", NO_RETRY)
    if isinstance(error, NoWarmCapacity):
        return E2bError(503, f"no warm sandbox available right now; retry: {error}")
    if isinstance(error, NodeUnavailable):
        # Why names the fleet's own addresses: the log has it, a tenant does not.
        log.warning("a node failed an e2b request: %s", error)
        return E2bError(502, "the sandbox's node is unreachable", NO_RETRY)
    if isinstance(error, ClaimRoutingOff):
        return E2bError(503, str(error), NO_RETRY)
    return _by_status(error)


def _by_status(error: Exception) -> E2bError:
    code = status_of(error)
    if code == 500:
        log.error("unexpected error serving an e2b request", exc_info=error)
        return E2bError(500, f"internal error: {type(error).__name__}")
    if isinstance(error, InvalidValueError):  # a body, a parameter: the client's mistake
        return E2bError(400, refusal(error))
    return E2bError(code, str(error), NO_RETRY if code >= 500 else None)


def answer_error(_: Request, error: Exception) -> HttpError:
    """Any error a route raised, as e2b answers it (for the app's error handlers)."""
    if isinstance(error, RequestValidationError):
        return E2bError(400, f"invalid request: {error}")
    return translate(error)


def unmatched(status: int, detail: str) -> E2bError:
    messages = {404: "no such endpoint", 405: "method not allowed on this endpoint"}
    return E2bError(status, messages.get(status, detail))

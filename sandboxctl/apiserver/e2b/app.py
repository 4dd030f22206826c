"""The e2b-compatible control-plane API over one sandbox store: a router over the
service.

Every request but ``GET /health`` carries ``X-API-Key``; the key decides the namespace
the request sees and drives (a sandbox of another namespace is 404, not 403). Every
non-2xx body is ``{"code": <status>, "message": <text>}``, which the SDK needs to raise
its typed exceptions. Options this fleet cannot honour are refused with 400 naming the
option, never ignored. See docs/e2b-compat.md for the endpoint table; the routes are
``routes.ROUTES``, one function each.

It serves no ``/metrics`` of its own: a tenant's key must not read the fleet's figures.
With ``times``, its requests are timed there as :data:`SERVICE` (``serving.metrics``),
and the process serves that registry on a listener of its own (``MetricsListener``).
"""

from __future__ import annotations

from typing import Final

from fastapi import FastAPI

from sandboxctl.apiserver.e2b.config import E2bConfig
from sandboxctl.apiserver.e2b.routes import ROUTES
from sandboxctl.apiserver.e2b.service import E2bError, E2bService, answer_error, unmatched
from sandboxctl.serving.apps import BodyCap, install_error_handlers, json_app
from sandboxctl.serving.metrics import RequestTimes, timed
from sandboxctl.store import SandboxStore

MAX_BODY_BYTES: Final = 1 << 20  # every body is a small JSON object
SERVICE: Final = "e2b"


def create_e2b_app(
    store: SandboxStore, config: E2bConfig, times: RequestTimes | None = None
) -> FastAPI:
    """The e2b API app over ``store``; ``config`` fixes keys, domain, secret and aliases;
    its requests are timed into ``times`` (as service ``e2b``) when given."""
    app = json_app("sandboxctl e2b API")
    app.state.e2b = E2bService(store, config)
    for method, path, route in ROUTES:
        app.add_api_route(path, route, methods=[method])
    install_error_handlers(app, translate=answer_error, unmatched=unmatched)
    app.add_middleware(BodyCap, limit=MAX_BODY_BYTES, refuse=_too_large)
    return timed(app, times, SERVICE)  # around it all: a refused body is timed too


def _too_large(limit: int) -> E2bError:
    return E2bError(413, f"the request body is over {limit} bytes")

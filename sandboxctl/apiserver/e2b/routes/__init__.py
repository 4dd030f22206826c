"""The e2b API's routes, one plain function each over the service (``service.py``):
``templates`` (health and the template catalog), ``sandboxes`` (create, the lists, one
sandbox's reads and verbs), ``observe`` (metrics and logs) and ``unserved`` (e2b's
operations this fleet does not serve: 501, saying why). :data:`ROUTES` is the
whole API, in the order the app matches it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from sandboxctl.apiserver.e2b.routes import observe, sandboxes, templates
from sandboxctl.apiserver.e2b.routes.unserved import UNSERVED, refusal

Route = tuple[str, str, Callable[..., Any]]  # method, path, function

ROUTES: Final[tuple[Route, ...]] = (
    ("GET", "/health", templates.health),
    ("GET", "/templates/aliases/{alias}", templates.template_alias),
    ("GET", "/templates", templates.templates),
    ("GET", "/v2/templates", templates.templates),
    ("GET", "/templates/{template_id}", templates.one_template),
    ("POST", "/sandboxes", sandboxes.create),
    ("POST", "/v2/sandboxes", sandboxes.create),
    ("GET", "/v2/sandboxes", sandboxes.list_v2),
    ("GET", "/sandboxes", sandboxes.list_v1),
    # before /sandboxes/{sandbox_id}, which would take "metrics" for an id
    ("GET", "/sandboxes/metrics", observe.many_metrics),
    ("GET", "/sandboxes/{sandbox_id}", sandboxes.get_info),
    ("DELETE", "/sandboxes/{sandbox_id}", sandboxes.kill),
    ("PUT", "/sandboxes/{sandbox_id}/network", sandboxes.set_network),
    ("POST", "/sandboxes/{sandbox_id}/timeout", sandboxes.set_timeout),
    ("POST", "/sandboxes/{sandbox_id}/refreshes", sandboxes.refresh),
    ("POST", "/sandboxes/{sandbox_id}/connect", sandboxes.connect),
    ("POST", "/v2/sandboxes/{sandbox_id}/connect", sandboxes.connect),
    ("POST", "/sandboxes/{sandbox_id}/pause", sandboxes.pause),
    ("POST", "/sandboxes/{sandbox_id}/resume", sandboxes.resume),
    ("GET", "/sandboxes/{sandbox_id}/metrics", observe.sandbox_metrics),
    ("GET", "/sandboxes/{sandbox_id}/logs", observe.logs_v1),
    ("GET", "/v2/sandboxes/{sandbox_id}/logs", observe.logs_v2),
    # last: e2b's operations this fleet does not serve answer 501 saying why
    *((operation.method, operation.path, refusal(operation)) for operation in UNSERVED),
)

__all__ = ["ROUTES", "UNSERVED", "Route"]

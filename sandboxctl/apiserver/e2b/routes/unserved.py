"""The e2b operations this fleet does not serve: each answers ``501 {"code": 501,
"message": "<what> is not served by this fleet: <why>"}``, so an SDK call raises a clear
exception (the Python SDK a ``SandboxException``, the JS SDK a ``SandboxError``) instead
of a 404 it would take for a missing sandbox. The key is checked first, as on every
route. :data:`UNSERVED` lists every operation of e2b's API, and every one the pinned SDKs
call, that ``ROUTES`` does not serve (docs/e2b-compat.md draws the same table)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final

from sandboxctl.apiserver.e2b.service import NO_RETRY, E2bError, Tenant

NOT_SERVED: Final = 501

SNAPSHOTS: Final = (
    "the sandbox runtime keeps no copy of a sandbox's memory or disk "
    "(pause freezes a sandbox in place; connect resumes it)"
)
BUILDS: Final = (
    "templates are built on each host with `sandboxctl template build`, not through the API"
)
TEMPLATE_REMOVAL: Final = "templates are each host's own: `sandboxctl template rm` on the host"
TAGS: Final = "template builds have no tags"
TEAMS: Final = "there are no teams: an API key maps to a namespace"
KEYS: Final = "API keys come from the server's --e2b-api-key-file; there are no access tokens"
VOLUMES: Final = "volumes are not served"
SECRETS: Final = "secrets are not served; pass envVars at create"
ADMIN: Final = (
    "e2b's admin routes are not served: the fleet's nodes are in `sandboxctl inventory` "
    "and `kubectl get nodeinventories`"
)


@dataclass(frozen=True, slots=True)
class Unserved:
    """One operation this fleet does not serve, and why, in words for the SDK's user."""

    method: str
    path: str
    what: str
    why: str

    @property
    def message(self) -> str:
        return f"{self.what} ({self.method} {self.path}) is not served by this fleet: {self.why}"


UNSERVED: Final[tuple[Unserved, ...]] = (
    Unserved("POST", "/sandboxes/{sandbox_id}/fork", "fork", SNAPSHOTS),
    Unserved("POST", "/sandboxes/{sandbox_id}/snapshots", "a snapshot", SNAPSHOTS),
    Unserved("GET", "/snapshots", "the snapshot list", SNAPSHOTS),
    Unserved("GET", "/default-templates", "the default templates", "list them with GET /templates"),
    # before /templates/{template_id}, which would take "tags" for an id
    Unserved("POST", "/templates/tags", "template tags", TAGS),
    Unserved("DELETE", "/templates/tags", "template tags", TAGS),
    Unserved("POST", "/templates", "a template build", BUILDS),
    Unserved("POST", "/v2/templates", "a template build", BUILDS),
    Unserved("POST", "/v3/templates", "a template build", BUILDS),
    Unserved("POST", "/templates/{template_id}", "a template rebuild", BUILDS),
    Unserved("PATCH", "/templates/{template_id}", "a template update", BUILDS),
    Unserved("PATCH", "/v2/templates/{template_id}", "a template update", BUILDS),
    Unserved("POST", "/templates/{template_id}/builds/{build_id}", "a template build", BUILDS),
    Unserved("POST", "/v2/templates/{template_id}/builds/{build_id}", "a template build", BUILDS),
    Unserved("GET", "/templates/{template_id}/files/{hash}", "a build file upload", BUILDS),
    Unserved(
        "GET", "/templates/{template_id}/builds/{build_id}/status", "a build's status", BUILDS
    ),
    Unserved("GET", "/templates/{template_id}/builds/{build_id}/logs", "a build's logs", BUILDS),
    Unserved("DELETE", "/templates/{template_id}", "a template removal", TEMPLATE_REMOVAL),
    Unserved("GET", "/templates/{template_id}/tags", "template tags", TAGS),
    Unserved("GET", "/templates/{template_id}/tags/count", "template tags", TAGS),
    Unserved("GET", "/templates/{template_id}/tags/exists", "template tags", TAGS),
    Unserved("GET", "/templates/{template_id}/tags/groups", "template tags", TAGS),
    Unserved("GET", "/templates/{template_id}/tags/{tag}/assignments", "template tags", TAGS),
    Unserved("GET", "/teams", "teams", TEAMS),
    Unserved("GET", "/teams/{team_id}/metrics", "a team's metrics", TEAMS),
    Unserved("GET", "/teams/{team_id}/metrics/max", "a team's metrics", TEAMS),
    Unserved("POST", "/access-tokens", "access tokens", KEYS),
    Unserved("DELETE", "/access-tokens/{access_token_id}", "access tokens", KEYS),
    Unserved("GET", "/api-keys", "API keys", KEYS),
    Unserved("POST", "/api-keys", "API keys", KEYS),
    Unserved("PATCH", "/api-keys/{api_key_id}", "API keys", KEYS),
    Unserved("DELETE", "/api-keys/{api_key_id}", "API keys", KEYS),
    Unserved("GET", "/volumes", "volumes", VOLUMES),
    Unserved("POST", "/volumes", "volumes", VOLUMES),
    Unserved("GET", "/volumes/{volume_id}", "volumes", VOLUMES),
    Unserved("DELETE", "/volumes/{volume_id}", "volumes", VOLUMES),
    Unserved("GET", "/volumecontent/{volume_id}/dir", "a volume's content", VOLUMES),
    Unserved("POST", "/volumecontent/{volume_id}/dir", "a volume's content", VOLUMES),
    Unserved("GET", "/volumecontent/{volume_id}/path", "a volume's content", VOLUMES),
    Unserved("PATCH", "/volumecontent/{volume_id}/path", "a volume's content", VOLUMES),
    Unserved("DELETE", "/volumecontent/{volume_id}/path", "a volume's content", VOLUMES),
    Unserved("GET", "/volumecontent/{volume_id}/file", "a volume's content", VOLUMES),
    Unserved("PUT", "/volumecontent/{volume_id}/file", "a volume's content", VOLUMES),
    Unserved("GET", "/secrets", "secrets", SECRETS),
    Unserved("POST", "/secrets", "secrets", SECRETS),
    Unserved("GET", "/secrets/{secret_id}", "secrets", SECRETS),
    Unserved("POST", "/secrets/{secret_id}", "secrets", SECRETS),
    Unserved("DELETE", "/secrets/{secret_id}", "secrets", SECRETS),
    Unserved("GET", "/nodes", "nodes", ADMIN),
    Unserved("GET", "/nodes/{node_id}", "nodes", ADMIN),
    Unserved("POST", "/nodes/{node_id}", "nodes", ADMIN),
    Unserved("POST", "/admin/teams/{team_id}/sandboxes/kill", "an admin kill", ADMIN),
    Unserved("GET", "/admin/sandboxes/running-counts", "running counts", ADMIN),
    Unserved("POST", "/admin/teams/{team_id}/builds/cancel", "an admin build cancel", ADMIN),
    Unserved("POST", "/admin/teams/{team_id}/api-keys", "admin API keys", ADMIN),
    Unserved("DELETE", "/admin/teams/{team_id}/api-keys/{api_key_id}", "admin API keys", ADMIN),
)


def refusal(operation: Unserved) -> Callable[[str], Coroutine[Any, Any, None]]:
    """The route of ``operation``: 501 naming it and why, once the key is checked."""
    message = operation.message

    async def not_served(_namespace: Tenant) -> None:
        raise E2bError(NOT_SERVED, message, NO_RETRY)

    not_served.__name__ = f"unserved_{operation.method.lower()}"
    return not_served

"""The Sandbox API behind kube-apiserver's aggregation layer: delegated authentication and
authorization, as an aggregated API server does them.

**Authentication (requestheader).** kube-apiserver reaches this server over TLS with its
front-proxy client certificate and names the user in headers. A request is believed only
when its connection presented a certificate signed by ``--requestheader-client-ca-file``
(the TLS handshake checks the signature) whose common name is one of
``--requestheader-allowed-names`` (any, when none are given); then the user is
``X-Remote-User``, the groups every ``X-Remote-Group`` and the extras the
``X-Remote-Extra-<key>`` headers. Anything else is 401. The headers are removed before
the request goes further. As every Kubernetes authenticator does, a user so believed is
in ``system:authenticated`` too: kube-apiserver's own callers (the discovery and OpenAPI
fetches of ``system:kube-aggregator`` and ``system:aggregator``) send no group, and
discovery is allowed to the authenticated (``system:discovery``).

**Authorization (SubjectAccessReview).** Each request's attributes (verb, group, resource,
namespace, name; or the path of a non-resource request such as discovery) are sent to
kube-apiserver as a SubjectAccessReview for that user. Answers are cached for
``ttl`` (10 s, allowed and denied alike), so a burst of requests costs one review; a
denial is 403, a review that cannot be made is 503.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final

from kubernetes import client
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from sandboxctl.apiserver.auth import HEALTH_PATHS
from sandboxctl.apiserver.status import status_body
from sandboxctl.core.names import SANDBOXES
from sandboxctl.kube.errors import KubeError, call

USER_HEADERS: Final = ("x-remote-user",)
GROUP_HEADERS: Final = ("x-remote-group",)
EXTRA_PREFIX: Final = "x-remote-extra-"
AUTHENTICATED: Final = "system:authenticated"
UNAUTHENTICATED: Final = "system:unauthenticated"
ANONYMOUS: Final = "system:anonymous"
CACHE_TTL: Final = timedelta(seconds=10)
_RESOURCE_PREFIX: Final = f"/apis/{SANDBOXES.group}/{SANDBOXES.version}/"


@dataclass(frozen=True, slots=True)
class User:
    name: str
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class Attributes:
    verb: str
    namespace: str = ""
    name: str = ""
    subresource: str = ""
    path: str = ""  # set for a non-resource request

    def review_for(self, user: User) -> client.V1SubjectAccessReview:
        spec = client.V1SubjectAccessReviewSpec(
            user=user.name,
            groups=list(user.groups),
            extra={k: list(v) for k, v in user.extra} or None,
        )
        if self.path:
            spec.non_resource_attributes = client.V1NonResourceAttributes(
                path=self.path, verb=self.verb
            )
        else:
            spec.resource_attributes = client.V1ResourceAttributes(
                verb=self.verb,
                group=SANDBOXES.group,
                version=SANDBOXES.version,
                resource=SANDBOXES.plural,
                subresource=self.subresource or None,
                namespace=self.namespace or None,
                name=self.name or None,
            )
        return client.V1SubjectAccessReview(spec=spec)


@dataclass(frozen=True, slots=True)
class RequestHeaderConfig:
    allowed_names: frozenset[str] = frozenset()
    user_headers: Sequence[str] = USER_HEADERS
    group_headers: Sequence[str] = GROUP_HEADERS
    extra_prefix: str = EXTRA_PREFIX


class AccessReviewer:
    """SubjectAccessReviews with a TTL cache; thread-safe."""

    def __init__(
        self,
        api: client.ApiClient,
        ttl: timedelta = CACHE_TTL,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = client.AuthorizationV1Api(api)
        self._ttl = ttl.total_seconds()
        self._monotonic = monotonic
        self._cache: dict[tuple[User, Attributes], tuple[float, bool, str]] = {}
        self._lock = threading.Lock()
        self.reviews = 0

    def review(self, user: User, attrs: Attributes) -> tuple[bool, str]:
        """(allowed, reason); KubeError when the review cannot be made."""
        key = (user, attrs)
        now = self._monotonic()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and cached[0] > now:
                return cached[1], cached[2]
        body = attrs.review_for(user)
        answer = call(
            "create subjectaccessreviews.authorization.k8s.io",
            lambda: self._api.create_subject_access_review(body, _request_timeout=5.0),
        )
        self.reviews += 1
        status = answer.status
        allowed = bool(status is not None and status.allowed)
        reason = str((status.reason if status is not None else "") or "")
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[key] = (now + self._ttl, allowed, reason)
        return allowed, reason


@dataclass
class Delegated:
    """ASGI middleware: requestheader authentication, then SubjectAccessReview."""

    app: ASGIApp
    reviewer: AccessReviewer
    config: RequestHeaderConfig = field(default_factory=RequestHeaderConfig)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in HEALTH_PATHS:
            await self.app(scope, receive, send)
            return
        user = self._authenticate(scope)
        if user is None:
            await _answer(send, status_body(401, "Unauthorized"))
            return
        attrs = _attributes(scope)
        try:
            allowed, reason = await run_in_threadpool(self.reviewer.review, user, attrs)
        except KubeError as error:
            await _answer(send, status_body(503, f"authorization is unavailable: {error}"))
            return
        if not allowed:
            await _answer(send, _forbidden(user, attrs, reason))
            return
        await self.app(scope, receive, send)

    def _authenticate(self, scope: Scope) -> User | None:
        certificate = ((scope.get("extensions") or {}).get("tls") or {}).get("client_cert")
        if not certificate:
            return None
        if self.config.allowed_names and _common_name(certificate) not in self.config.allowed_names:
            return None
        names: list[str] = []
        groups: list[str] = []
        extra: dict[str, list[str]] = {}
        kept = []
        for raw_name, raw_value in scope["headers"]:
            name = raw_name.decode("latin-1").lower()
            value = raw_value.decode("latin-1")
            if name in self.config.user_headers:
                names.append(value)
            elif name in self.config.group_headers:
                groups.append(value)
            elif name.startswith(self.config.extra_prefix):
                extra.setdefault(name[len(self.config.extra_prefix) :], []).append(value)
            else:
                kept.append((raw_name, raw_value))
        scope["headers"] = kept  # nothing further down may trust them
        if not names or not names[0]:
            return None
        extras = tuple((k, tuple(v)) for k, v in sorted(extra.items()))
        return User(names[0], authenticated_groups(names[0], groups), extras)


def authenticated_groups(name: str, groups: Sequence[str]) -> tuple[str, ...]:
    """``groups`` with ``system:authenticated`` added, as Kubernetes adds it to every
    authenticated user but the anonymous one (and never beside either marker group)."""
    if name == ANONYMOUS or AUTHENTICATED in groups or UNAUTHENTICATED in groups:
        return tuple(groups)
    return (*groups, AUTHENTICATED)


def _common_name(certificate: dict[str, Any]) -> str:
    for rdn in certificate.get("subject") or ():
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""


def _attributes(scope: Scope) -> Attributes:
    path: str = scope["path"]
    method: str = scope["method"]
    if not path.startswith(_RESOURCE_PREFIX):
        return Attributes(verb=method.lower() if method != "HEAD" else "get", path=path)
    parts = [p for p in path[len(_RESOURCE_PREFIX) :].split("/") if p]
    namespace = ""
    if len(parts) >= 2 and parts[0] == "namespaces":
        namespace, parts = parts[1], parts[2:]
    if not parts or parts[0] != SANDBOXES.plural:
        return Attributes(verb="get", path=path)  # the group-version's discovery
    name = parts[1] if len(parts) > 1 else ""
    subresource = parts[2] if len(parts) > 2 else ""
    query = scope.get("query_string", b"").decode("latin-1")
    watching = any(p in ("watch=true", "watch=1") for p in query.split("&"))
    verb = {
        "GET": "get" if name else ("watch" if watching else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if name else "deletecollection",
    }.get(method, method.lower())
    return Attributes(verb, namespace, name, subresource)


def _forbidden(user: User, attrs: Attributes, reason: str) -> dict[str, object]:
    if attrs.path:
        message = f'forbidden: User "{user.name}" cannot {attrs.verb} path "{attrs.path}"'
    else:
        where = f' in the namespace "{attrs.namespace}"' if attrs.namespace else ""
        target = f' "{attrs.name}"' if attrs.name else ""
        message = (
            f'{SANDBOXES.qualified}{target} is forbidden: User "{user.name}" cannot '
            f'{attrs.verb} resource "{SANDBOXES.plural}" in API group "{SANDBOXES.group}"{where}'
        )
    if reason:
        message += f": {reason}"
    return status_body(
        403,
        message,
        details={"group": SANDBOXES.group, "kind": SANDBOXES.plural, "name": attrs.name},
    )


async def _answer(send: Send, body: dict[str, object]) -> None:
    payload = json.dumps(body, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload))]
    await send({"type": "http.response.start", "status": body["code"], "headers": headers})
    await send({"type": "http.response.body", "body": payload})

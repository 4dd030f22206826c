"""Who may use the Sandbox API: bearer tokens from a token file, each with its namespaces.

The token file (``--kube-token-file``) has one token per line, followed by the namespaces
it may use, whitespace-separated; ``*`` stands for every namespace (and is needed to list
across namespaces). ``#`` starts a comment; blank lines are skipped; a token alone, a
repeated token or a namespace that cannot be one fails startup naming the line::

    # token                                    namespaces
    4q0c...Jk                                  *
    Xb7m...Qe                                  team-a team-b

Every request but the health checks (``/healthz``, ``/livez``, ``/readyz``) carries
``Authorization: Bearer <token>``. No token, or one not in the file: 401 ``Unauthorized``.
A token used in a namespace it does not list (or across namespaces without ``*``): 403
``Forbidden``. Both answer a Kubernetes ``Status``, which kubectl prints as
``error: You must be logged in to the server (Unauthorized)`` and ``Error from server
(Forbidden): ...``.

The check is one SHA-256 of the offered token and one dictionary lookup: the file's tokens
are kept only as digests, so the lookup's timing tells nothing about them.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from starlette.types import ASGIApp, Receive, Scope, Send

from sandboxctl.apiserver.status import status_body
from sandboxctl.core.errors import ConfigurationError
from sandboxctl.core.names import SANDBOXES

ALL_NAMESPACES: Final = "*"
HEALTH_PATHS: Final = frozenset({"/healthz", "/livez", "/readyz"})
_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_NAMESPACED: Final = f"/apis/{SANDBOXES.group}/{SANDBOXES.version}/namespaces/"
_ACROSS_NAMESPACES: Final = f"/apis/{SANDBOXES.group}/{SANDBOXES.version}/{SANDBOXES.plural}"


def _digest(token: str | bytes) -> bytes:
    raw = token.encode() if isinstance(token, str) else token
    return hashlib.sha256(raw).digest()


class KubeTokens:
    """The tokens of a token file, by digest, with the namespaces each may use."""

    def __init__(self, tokens: Mapping[str, frozenset[str]]) -> None:
        self._grants = {_digest(token): namespaces for token, namespaces in tokens.items()}

    def __len__(self) -> int:
        return len(self._grants)

    def namespaces(self, offered: bytes) -> frozenset[str] | None:
        """The namespaces an offered token may use, or None when it is not a token."""
        return self._grants.get(_digest(offered)) if offered else None


def load_kube_tokens(path: Path) -> KubeTokens:
    """Read a token file; a line that does not fit is a ConfigurationError naming it."""
    return KubeTokens(dict(_entries(path)))


def first_token(path: Path) -> str:
    """The first token of a token file: the one a written kubeconfig carries."""
    return _entries(path)[0][0]


def _entries(path: Path) -> list[tuple[str, frozenset[str]]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise ConfigurationError(f"--kube-token-file {path}: {reason}") from error
    entries: dict[str, frozenset[str]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        where = f"--kube-token-file {path}:{number}"
        token, namespaces = fields[0], fields[1:]
        if not namespaces:
            raise ConfigurationError(
                f"{where}: a token needs the namespaces it may use after it ('*' for all)"
            )
        for namespace in namespaces:
            if namespace != ALL_NAMESPACES and not _LABEL.fullmatch(namespace):
                raise ConfigurationError(f"{where}: {namespace!r} is not a namespace name")
        if token in entries:
            raise ConfigurationError(f"{where}: the token is listed twice")
        entries[token] = frozenset(namespaces)
    if not entries:
        raise ConfigurationError(f"--kube-token-file {path}: no tokens in the file")
    return list(entries.items())


def token_line(token: str, namespaces: str = ALL_NAMESPACES) -> str:
    """One line of a token file."""
    return f"{token} {namespaces}\n"


class Authenticated:
    """ASGI middleware: every request but the health checks needs a token that may use
    the namespace the path names (every namespace, for a list across them)."""

    def __init__(self, app: ASGIApp, tokens: KubeTokens) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in HEALTH_PATHS:
            await self.app(scope, receive, send)
            return
        namespaces = self.tokens.namespaces(_bearer(scope))
        if namespaces is None:
            await _refuse(send, status_body(401, "Unauthorized"))
            return
        if ALL_NAMESPACES not in namespaces:
            wanted = _namespace_of(scope["path"])
            if wanted is not None and wanted not in namespaces:
                await _refuse(send, _forbidden(wanted))
                return
        await self.app(scope, receive, send)


def _bearer(scope: Scope) -> bytes:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else b""
    return b""


def _namespace_of(path: str) -> str | None:
    """The namespace a path acts in; ``*`` for a list across namespaces; None for
    discovery, which every token may read."""
    if path.startswith(_NAMESPACED):
        return path[len(_NAMESPACED) :].partition("/")[0]
    if path.rstrip("/") == _ACROSS_NAMESPACES:
        return ALL_NAMESPACES
    return None


def _forbidden(namespace: str) -> dict[str, object]:
    where = (
        "across namespaces (that needs a token for '*')"
        if namespace == ALL_NAMESPACES
        else f'in the namespace "{namespace}"'
    )
    return status_body(
        403,
        f"{SANDBOXES.qualified} is forbidden: this token may not use {SANDBOXES.plural} {where}",
        details={"group": SANDBOXES.group, "kind": SANDBOXES.plural},
    )


async def _refuse(send: Send, body: dict[str, object]) -> None:
    payload = json.dumps(body, separators=(",", ":")).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(payload)),
    ]
    if body["code"] == 401:
        headers.append((b"www-authenticate", b'Bearer realm="sandboxctl"'))
    await send({"type": "http.response.start", "status": body["code"], "headers": headers})
    await send({"type": "http.response.body", "body": payload})

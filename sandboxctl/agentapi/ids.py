"""Sandbox ids in the agent's URLs: which strings can be one, and how one is written.

An agent names a sandbox ``sb_`` and 12 hex digits; the e2b API serves the DNS-safe
spelling ``sb-...`` and accepts either, and another agent may name its sandboxes
otherwise. So an id is 1 to 128 characters of ``[A-Za-z0-9_.-]``, starting with a letter
or a digit (``.`` and ``..`` would walk the URL path). Anything else (empty, too long, a
``/``, whitespace, a control character, ``%``) cannot name a sandbox: the client refuses
it before any request with :class:`InvalidId`, a 404 like the agent's own, so callers that
read 404 as "no such sandbox" need no case of their own. An accepted id is still escaped
(``quote(id, safe="")``), so a path segment stays one segment even if the rule widens.
"""

from __future__ import annotations

import re
from urllib.parse import quote

MAX_ID_LENGTH = 128
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def id_problem(sandbox_id: str) -> str | None:
    """Why ``sandbox_id`` cannot name a sandbox, or None when it can."""
    if not sandbox_id:
        return "is empty"
    if len(sandbox_id) > MAX_ID_LENGTH:
        return f"is longer than {MAX_ID_LENGTH} characters"
    if not _ID.fullmatch(sandbox_id):
        return "may hold only letters, digits, '_', '.' and '-', and start with a letter or digit"
    return None


def sandbox_path(sandbox_id: str, verb: str = "") -> str:
    """``/v1/sandboxes/{id}[/{verb}]`` for an id :func:`id_problem` accepted."""
    path = f"/v1/sandboxes/{quote(sandbox_id, safe='')}"
    return f"{path}/{verb}" if verb else path

"""Signed file URLs (docs/envd-proxy.md): ``/files`` may carry a signature instead of the
``X-Access-Token`` header, so that ``download_url()`` and ``upload_url()`` work from a
browser or curl with no headers at all.

The signature is ``v1_`` + unpadded base64 of
sha256(``"{path}:{read|write}:{username}:{access token}[:{expiration}]"``), the
expiration in unix seconds; the SDK computes it in ``e2b/sandbox/signature.py``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qs

OPERATIONS: Final = {"GET": "read", "HEAD": "read", "POST": "write"}


class BadSignature(Exception):
    """The signature parameters do not parse (400), as opposed to not matching (401)."""


@dataclass(frozen=True, slots=True)
class FileSignature:
    operation: str  # read | write
    path: str
    user: str
    signature: str
    expiration: int | None

    def problem(self, access_token: str, now: float) -> str | None:
        """Why this signature does not admit the request, or None when it does."""
        parts = [self.path, self.operation, self.user, access_token]
        if self.expiration is not None:
            parts.append(str(self.expiration))
        digest = hashlib.sha256(":".join(parts).encode()).digest()
        expected = "v1_" + base64.b64encode(digest).rstrip(b"=").decode("ascii")
        if not hmac.compare_digest(self.signature.encode(), expected.encode()):
            return "the file URL's signature does not match"
        if self.expiration is not None and self.expiration < now:
            return "the file URL's signature has expired"
        return None


def file_signature(method: str, path: str, query: bytes) -> FileSignature | None:
    """The signature a ``/files`` request carries; None for any other request, or when it
    carries none. Raises BadSignature for a malformed one."""
    operation = OPERATIONS.get(method)
    if operation is None or path.rstrip("/") != "/files" or b"signature" not in query:
        return None
    params = parse_qs(query.decode("latin-1"), keep_blank_values=True)
    signatures = params.get("signature")
    if not signatures:
        return None
    expirations = params.get("signature_expiration", [])
    if len(signatures) > 1 or len(expirations) > 1 or len(params.get("path", [])) > 1:
        raise BadSignature("a signed file URL names signature, its expiration and path once")
    paths = params.get("path", [])
    if operation == "write" and not (paths and paths[0]):
        # Without a path the parts' own file names would be written: anywhere.
        raise BadSignature("a signed upload URL names the path it may write")
    expiration = None
    if expirations:
        if not expirations[0].isdigit():
            raise BadSignature("signature_expiration: expected unix seconds")
        expiration = int(expirations[0])
    return FileSignature(
        operation=operation,
        path=params.get("path", [""])[0],
        user=params.get("username", [""])[0],
        signature=signatures[0],
        expiration=expiration,
    )

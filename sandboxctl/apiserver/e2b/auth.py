"""API keys: which namespace a request drives, or None when its key is wrong."""

from __future__ import annotations

import hmac
from collections.abc import Mapping


class Keys:
    def __init__(self, keys: Mapping[str, str], anonymous: bool, namespace: str) -> None:
        self._keys = [(key.encode(), ns) for key, ns in keys.items()]
        self._anonymous = anonymous
        self._namespace = namespace

    def namespace(self, offered: str | None) -> str | None:
        """The namespace of the offered key (None: refuse with 401). Every key is
        compared, in constant time, so the timing does not tell which key matched."""
        found = None
        given = (offered or "").encode()
        for key, namespace in self._keys:
            if hmac.compare_digest(given, key) and found is None:
                found = namespace
        if found is None and self._anonymous:
            return self._namespace  # anonymous mode: no key (or an unknown one) is fine
        return found

"""A kubeconfig that points kubectl (or the Python client) at this API server.

One cluster, one user without credentials and one context, all named ``sandboxctl``,
with ``default`` as the namespace; plain HTTP to the server URL. The file replaces any
previous one atomically and is readable by its owner only (0600).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

import yaml

from sandboxctl.secretfiles import write_private

NAME: Final = "sandboxctl"
NAMESPACE: Final = "default"


def kubeconfig(server_url: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": NAME, "cluster": {"server": server_url}}],
        "users": [{"name": NAME, "user": {}}],
        "contexts": [
            {"name": NAME, "context": {"cluster": NAME, "user": NAME, "namespace": NAMESPACE}}
        ],
        "current-context": NAME,
        "preferences": {},
    }


def server_url(host: str, port: int) -> str:
    """``http://HOST:PORT`` for a listen address; a wildcard host becomes loopback."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def write_kubeconfig(path: str | os.PathLike[str], server_url: str) -> Path:
    """Write the kubeconfig for ``server_url`` to ``path`` (mode 0600, atomically)."""
    target = Path(path)
    write_private(target, yaml.safe_dump(kubeconfig(server_url), sort_keys=False))
    return target

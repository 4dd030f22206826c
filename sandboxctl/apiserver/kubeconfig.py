"""A kubeconfig that points kubectl (or the Python client) at this API server.

One cluster, one user holding a bearer token (the Sandbox API's) and one context, all
named ``sandboxctl``, with ``default`` as the namespace. Over HTTPS the cluster trusts the
server's own certificate (``certificate-authority-data``), so a self-signed one works as
it is. The file holds the token: it replaces any previous one atomically and is readable
by its owner only (0600).
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any, Final

import yaml

from sandboxctl.secretfiles import write_private

NAME: Final = "sandboxctl"
NAMESPACE: Final = "default"


def kubeconfig(
    server_url: str, token: str | None = None, ca_pem: bytes | None = None
) -> dict[str, Any]:
    cluster: dict[str, str] = {"server": server_url}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode("ascii")
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": NAME, "cluster": cluster}],
        "users": [{"name": NAME, "user": {"token": token} if token else {}}],
        "contexts": [
            {"name": NAME, "context": {"cluster": NAME, "user": NAME, "namespace": NAMESPACE}}
        ],
        "current-context": NAME,
        "preferences": {},
    }


def server_url(host: str, port: int, tls: bool = False) -> str:
    """``http://HOST:PORT`` (``https`` with ``tls``) for a listen address; a wildcard host
    becomes loopback."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"{'https' if tls else 'http'}://{host}:{port}"


def write_kubeconfig(
    path: str | os.PathLike[str],
    server_url: str,
    token: str | None = None,
    ca_pem: bytes | None = None,
) -> Path:
    """Write the kubeconfig for ``server_url`` and ``token`` (None: a user without
    credentials, for a server that asks none) to ``path`` (mode 0600, atomically);
    ``ca_pem``: the certificate(s) to trust for an HTTPS server."""
    target = Path(path)
    text = yaml.safe_dump(kubeconfig(server_url, token, ca_pem), sort_keys=False)
    write_private(target, text)
    return target

"""The fleet's state directory: its secrets, created on first start and reused after,
and the client files (``e2b.env``, ``kubeconfig``) that point the e2b SDK and kubectl at
it. Nothing in it is for sandbox uids, so it is private (0700) and may be anywhere; what
they reach is in the agent's runtime dir (``sandboxctl.sandboxd.runtimedir``), which
``DIR/runtime`` points to."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sandboxctl.apiserver.auth import KubeTokens, first_token, load_kube_tokens, token_line
from sandboxctl.apiserver.e2b import load_api_keys
from sandboxctl.apiserver.kubeconfig import server_url, write_kubeconfig
from sandboxctl.core.errors import ConfigurationError
from sandboxctl.core.statedir import (
    AGENT_DIR,
    ENDPOINTS_FILE,
    ENV_FILE,
    ENVD_SECRET_FILE,
    KEY_FILE,
    KUBE_TOKEN_FILE,
    KUBECONFIG_FILE,
    TOKEN_FILE,
    ServeEndpoints,
    endpoints_text,
)
from sandboxctl.secretfiles import create_secret, write_private

if TYPE_CHECKING:
    from sandboxctl.fleet.run import Fleet

log = logging.getLogger("sandboxctl.serve")

NAMESPACE = "default"
__all__ = [  # the file names are core.statedir's, which status reads without serve's stack
    "AGENT_DIR",
    "ENV_FILE",
    "KUBECONFIG_FILE",
    "NAMESPACE",
    "TOKEN_FILE",
    "Secrets",
    "prepare_state_dir",
    "write_client_files",
]


@dataclass(frozen=True, slots=True)
class Secrets:
    api_key: str
    api_keys: Mapping[str, str]
    envd_secret: bytes
    root_token: str
    kube_tokens: KubeTokens
    kube_token: str  # the first of them: the one the kubeconfig carries


def prepare_state_dir(state_dir: Path) -> Secrets:
    """Create the directory (0700) and its secrets on first start; reuse them later."""
    if not state_dir.exists():
        state_dir.mkdir(parents=True)
        state_dir.chmod(0o700)  # secrets only: sandbox uids reach the runtime dir instead
        log.info("created %s", state_dir)
    elif not state_dir.is_dir():
        raise ConfigurationError(f"--state-dir {state_dir}: not a directory")
    (state_dir / AGENT_DIR).mkdir(mode=0o700, exist_ok=True)  # the agent's database
    key_file = state_dir / KEY_FILE
    fresh_key = f"e2b_{secrets.token_hex(20)}"
    create_secret(key_file, f"{fresh_key} {NAMESPACE}\n")
    api_keys = load_api_keys(key_file, namespace=NAMESPACE)
    envd_secret = create_secret(state_dir / ENVD_SECRET_FILE, secrets.token_hex(32) + "\n")
    root_token = create_secret(state_dir / TOKEN_FILE, secrets.token_urlsafe(32) + "\n")
    kube_file = state_dir / KUBE_TOKEN_FILE
    create_secret(kube_file, token_line(secrets.token_urlsafe(32)))  # every namespace
    return Secrets(
        api_key=next(iter(api_keys)),
        api_keys=api_keys,
        envd_secret=envd_secret.encode(),
        root_token=root_token,
        kube_tokens=load_kube_tokens(kube_file),
        kube_token=first_token(kube_file),
    )


def write_client_files(fleet: Fleet, found: Secrets, kube_ca: Path) -> None:
    """DIR/e2b.env for the e2b SDK and DIR/kubeconfig (the first kube token, and the
    Sandbox API's certificate to trust) for kubectl, and DIR/endpoints.json (the agent's
    address and the metrics listener, which neither names) for ``status``; all 0600."""
    env = (
        f"E2B_API_URL={fleet.url(fleet.ports.e2b)}\n"
        f"E2B_SANDBOX_URL={fleet.url(fleet.ports.proxy)}\n"
        f"E2B_API_KEY={found.api_key}\n"
    )
    write_private(fleet.state_dir / ENV_FILE, env)
    write_kubeconfig(
        fleet.state_dir / KUBECONFIG_FILE, fleet.kube_url, found.kube_token, kube_ca.read_bytes()
    )
    metrics = server_url("127.0.0.1", fleet.ports.metrics) if fleet.ports.metrics else ""
    endpoints = ServeEndpoints(sandboxd=fleet.agent_addr, metrics=metrics)
    write_private(fleet.state_dir / ENDPOINTS_FILE, endpoints_text(endpoints))

"""The files ``serve`` keeps in its state directory, named once: serve writes them
(``fleet/state.py``) and ``status`` reads them (``inventory/status.py``), which must not
load serve's stack to learn a file's name. Names and the endpoints file's format only: no
I/O here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sandboxctl.core.errors import ConfigurationError

DEFAULT_STATE_DIR = Path(".sandboxctl")  # serve's and status's default --state-dir

KEY_FILE = "e2b-api-keys"
ENVD_SECRET_FILE = "envd-secret"
TOKEN_FILE = "sandboxd-token"
KUBE_TOKEN_FILE = "kube-tokens"
ENV_FILE = "e2b.env"
KUBECONFIG_FILE = "kubeconfig"
ENDPOINTS_FILE = "endpoints.json"
AGENT_DIR = "sandboxd"


@dataclass(frozen=True, slots=True)
class ServeEndpoints:
    """What no client file names: the agent's ``HOST:PORT`` and the metrics listener's
    URL, as serve bound them on this start."""

    sandboxd: str
    metrics: str


def endpoints_text(endpoints: ServeEndpoints) -> str:
    return json.dumps({"sandboxd": endpoints.sandboxd, "metrics": endpoints.metrics}) + "\n"


def parse_endpoints(text: str, where: str) -> ServeEndpoints:
    """The endpoints file's content; a file serve did not write is one line naming
    ``where``."""
    try:
        document = json.loads(text)
        sandboxd, metrics = document["sandboxd"], document["metrics"]
    except (ValueError, KeyError, TypeError) as error:
        raise ConfigurationError(f"{where}: not an endpoints file serve wrote") from error
    if not isinstance(sandboxd, str) or not isinstance(metrics, str) or not sandboxd:
        raise ConfigurationError(f"{where}: not an endpoints file serve wrote")
    return ServeEndpoints(sandboxd, metrics)

"""Starting the double in this process (tests) and as a process (``__main__``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sandboxctl_testing.kubeapi.access import load_tokens
from sandboxctl_testing.kubeapi.resources import CRDS
from sandboxctl_testing.kubeapi.server import KubeApiServer, Settings
from sandboxctl_testing.kubeapi.store import DEFAULT_HISTORY, ApiError, Store

log = logging.getLogger(__name__)

#: The repository's CRDs, when this package runs from a checkout.
REPO_CRDS = Path(__file__).resolve().parents[3] / "manifests" / "crds"


@dataclass
class Running:
    server: KubeApiServer
    store: Store
    thread: threading.Thread

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        """End every open watch, stop serving, write the state file."""
        self.store.close()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def start(
    port: int = 0,
    *,
    host: str = "127.0.0.1",
    state: Path | None = None,
    crds: Iterable[Path] = (),
    token_file: Path | None = None,
    bookmark_seconds: float = 1.0,
    history: int = DEFAULT_HISTORY,
    request_log: Path | None = None,
) -> Running:
    store = Store(history=history, state=state)
    for directory in crds:
        register_crds(store, directory)
    settings = Settings(load_tokens(token_file), bookmark_seconds, request_log)
    server = KubeApiServer((host, port), store, settings)
    store.start()
    thread = threading.Thread(target=server.serve_forever, name="kubeapi-double", daemon=True)
    thread.start()
    return Running(server, store, thread)


def register_crds(store: Store, directory: Path) -> int:
    """Create (or update) every CustomResourceDefinition in ``directory``'s YAML files."""
    resource = store.registry.any_version(CRDS)
    assert resource is not None
    count = 0
    for path in sorted(directory.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not isinstance(document, dict) or document.get("kind") != "CustomResourceDefinition":
                continue
            name = document["metadata"]["name"]
            try:
                current = store.get(resource, "", name)
            except ApiError:
                store.create(resource, "", document, manager="kubeapi-double")
            else:
                body: dict[str, Any] = {
                    **document,
                    "metadata": {
                        **document["metadata"],
                        "resourceVersion": current["metadata"]["resourceVersion"],
                    },
                }
                store.update(resource, "", name, body, manager="kubeapi-double")
            count += 1
    return count

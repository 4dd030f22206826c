"""A real one-node stack for the unmodified e2b SDK: a host agent (bubblewrap sandboxes,
envd served by the agent), the mesh inventory, the store, the e2b API and the envd proxy,
all on loopback."""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from sandboxctl.apiserver.e2b import E2bConfig, create_e2b_app
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.model import PoolKey
from sandboxctl.inventory.mesh import MeshInventorySource
from sandboxctl.proxy import create_proxy_app
from sandboxctl.sandboxd.agent import Agent, AgentSettings
from sandboxctl.sandboxd.api import create_app
from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime
from sandboxctl.store import SandboxStore
from sandboxctl.store.nodes import NodeAccess
from tests.apiserver.helpers import serving
from tests.sandboxd.servers import free_port, sandboxes_unavailable, wait_until

TOKEN = "fleet-root-token"
DOMAIN = "sandboxes.test"


def skip_reason() -> str | None:
    if importlib.util.find_spec("e2b") is None:
        return "the e2b SDK is not installed"
    return sandboxes_unavailable()


@contextmanager
def sdk_stack(
    *, key: str, secret: bytes, uid_base: int, warm: int, prefix: str
) -> Iterator[dict[str, Any]]:
    """Yields the SDK's connection parameters (api_key, api_url, sandbox_url)."""
    with ExitStack() as stack:
        state = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
        state.chmod(0o711)
        stack.callback(shutil.rmtree, state, ignore_errors=True)
        port = free_port()
        settings = AgentSettings(
            node="node-a",
            advertise_addr=f"127.0.0.1:{port}",
            state_dir=state,
            pools={PoolKey("base"): warm},
            uid_base=uid_base,
            max_sandboxes=warm + 7,
        )
        agent = Agent(settings, BubblewrapRuntime())
        stack.callback(agent.stop, destroy=True)
        agent.start()
        stack.enter_context(serving(create_app(agent, TOKEN), port))
        source = MeshInventorySource(
            [settings.advertise_addr], TOKEN, poll_interval=timedelta(seconds=0.2)
        )
        source.start()
        stack.callback(source.stop)
        store = SandboxStore(source, FreshnessRule(), nodes=NodeAccess(TOKEN))
        stack.callback(store.close)
        wait_until(
            lambda: sum(c.warm for c in store.view().warm_candidates(PoolKey("base"))) >= warm,
            what="the warm pool to fill and list",
        )
        config = E2bConfig(domain=DOMAIN, envd_secret=secret, api_keys={key: "default"})
        api_url = stack.enter_context(serving(create_e2b_app(store, config)))
        proxy_url = stack.enter_context(serving(create_proxy_app(store, secret, DOMAIN)))
        yield {"api_key": key, "api_url": api_url, "sandbox_url": proxy_url}


def create_sandbox(sdk: dict[str, Any], **options: Any) -> Any:
    """``Sandbox.create``, again while the API has seen no warm sandbox (503, retryable):
    the agent refills its pool at once, but the API sees it at the next inventory poll."""
    from e2b import Sandbox
    from e2b.exceptions import ServiceBusyException

    def attempt() -> Any:
        try:
            return Sandbox.create(**options, **sdk)
        except ServiceBusyException as error:
            if "no warm sandbox available" in str(error):
                return None
            raise

    return wait_until(attempt, what="a warm sandbox")

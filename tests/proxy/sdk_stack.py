"""A real one-node stack for the unmodified e2b SDK: a host agent (bubblewrap sandboxes,
envd served by the agent), the mesh inventory, the store, the e2b API and the envd proxy,
all on loopback."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from sandboxctl.apiserver.e2b import E2bConfig, create_e2b_app
from sandboxctl.core.model import PoolKey
from sandboxctl.proxy import create_proxy_app
from sandboxctl.store import SandboxStore
from tests.apiserver.helpers import serving
from tests.sandboxd.servers import sandboxes_unavailable, wait_until
from tests.store.real_fleet import real_fleet

TOKEN = "fleet-root-token"
DOMAIN = "sandboxes.test"


def skip_reason() -> str | None:
    if importlib.util.find_spec("e2b") is None:
        return "the e2b SDK is not installed"
    return sandboxes_unavailable()


@contextmanager
def sdk_stack(
    *, key: str, secret: bytes, uid_base: int, warm: int, prefix: str, network: bool = False
) -> Iterator[dict[str, Any]]:
    """Yields the SDK's connection parameters (api_key, api_url, sandbox_url)."""
    with sdk_stack_and_store(
        key=key, secret=secret, uid_base=uid_base, warm=warm, prefix=prefix, network=network
    ) as (params, _):
        yield params


@contextmanager
def sdk_stack_and_store(
    *, key: str, secret: bytes, uid_base: int, warm: int, prefix: str, network: bool = False
) -> Iterator[tuple[dict[str, Any], SandboxStore]]:
    """:func:`sdk_stack`, and its store (which finds a sandbox's agent and claim token:
    a test may call the agent's own routes)."""
    with ExitStack() as stack:
        store = real_fleet(
            stack,
            nodes=["node-a"],
            pools={PoolKey("base"): warm},
            uid_base=uid_base,
            uid_step=0,
            max_sandboxes=warm + 7,
            token=TOKEN,
            prefix=prefix,
            network=network,
        ).store
        config = E2bConfig(domain=DOMAIN, envd_secret=secret, api_keys={key: "default"})
        api_url = stack.enter_context(serving(create_e2b_app(store, config)))
        proxy_url = stack.enter_context(serving(create_proxy_app(store, secret, DOMAIN)))
        yield {"api_key": key, "api_url": api_url, "sandbox_url": proxy_url}, store


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

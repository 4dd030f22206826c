"""End to end with the unmodified e2b SDK: a real host agent (bubblewrap sandboxes, envd
served by the agent), the mesh inventory, the store, the e2b API and the envd proxy, all
on loopback. Skipped when the agent does not serve envd yet or sandboxes cannot run."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

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
from tests.e2b.stack import real_stack_skip_reason
from tests.sandboxd.servers import free_port, wait_until

TOKEN = "fleet-root-token"
KEY = "e2b_" + "c" * 40
SECRET = b"envd-secret-for-proxy-sdk-tests"
DOMAIN = "sandboxes.test"
UID_BASE = 2_000_000 + (os.getpid() % 1000) * 20


def _skip_reason() -> str | None:
    if importlib.util.find_spec("e2b") is None:
        return "the e2b SDK is not installed"
    if importlib.util.find_spec("sandboxctl.envd") is None:
        return "the host agent does not serve envd yet"
    return real_stack_skip_reason()


@pytest.fixture(scope="module")
def sdk() -> Iterator[dict[str, Any]]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    with ExitStack() as stack:
        state = Path(tempfile.mkdtemp(prefix="sandboxctl-proxy-sdk-", dir="/tmp"))
        state.chmod(0o711)
        stack.callback(shutil.rmtree, state, ignore_errors=True)
        port = free_port()
        settings = AgentSettings(
            node="node-a",
            advertise_addr=f"127.0.0.1:{port}",
            state_dir=state,
            pools={PoolKey("base"): 1},
            uid_base=UID_BASE,
            max_sandboxes=8,
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
        wait_until(lambda: store.view().fresh_nodes() == ["node-a"], what="the node to list")
        config = E2bConfig(domain=DOMAIN, envd_secret=SECRET, api_keys={KEY: "default"})
        api_url = stack.enter_context(serving(create_e2b_app(store, config)))
        proxy_url = stack.enter_context(serving(create_proxy_app(store, SECRET, DOMAIN)))
        yield {"api_key": KEY, "api_url": api_url, "sandbox_url": proxy_url}


def test_commands_and_files_through_the_proxy(sdk: dict[str, Any]) -> None:
    from e2b import Sandbox
    from e2b.exceptions import SandboxNotRunningException

    sandbox = Sandbox.create(**sdk)
    try:
        assert sandbox.commands.run("echo hi").stdout == "hi\n"
        sandbox.files.write("/tmp/proxy.txt", "through the proxy")
        assert sandbox.files.read("/tmp/proxy.txt") == "through the proxy"
    finally:
        sandbox.kill()
    # Released, though its owner is still cached: the proxy says not found.
    with pytest.raises(SandboxNotRunningException):
        sandbox.commands.run("echo again")


def test_a_wrong_access_token_is_refused(sdk: dict[str, Any]) -> None:
    from e2b import Sandbox

    sandbox = Sandbox.create(**sdk)
    try:
        response = httpx.post(
            f"{sdk['sandbox_url']}/process.Process/List",
            headers={
                "E2b-Sandbox-Id": sandbox.sandbox_id,
                "E2b-Sandbox-Port": "49983",
                "X-Access-Token": "0" * 64,
                "Content-Type": "application/json",
            },
            content=b"{}",
        )
        assert response.status_code == 401
    finally:
        sandbox.kill()

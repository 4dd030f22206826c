"""Concurrent envd traffic through the proxy with the unmodified e2b SDK: a real host agent
(bubblewrap sandboxes, envd served by the agent), the mesh inventory, the store, the e2b
API and the envd proxy, all on loopback. Skipped when sandboxes cannot run."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

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
KEY = "e2b_" + "d" * 40
SECRET = b"envd-secret-for-proxy-concurrency-tests"
DOMAIN = "sandboxes.test"
# A uid block of its own, clear of test_sdk.py's (2_000_000 + ... * 20 < 2_020_000).
UID_BASE = 2_100_000 + (os.getpid() % 1000) * 20
SANDBOXES = 4
COMMANDS = 20


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
        state = Path(tempfile.mkdtemp(prefix="sandboxctl-proxy-concurrency-", dir="/tmp"))
        state.chmod(0o711)
        stack.callback(shutil.rmtree, state, ignore_errors=True)
        port = free_port()
        settings = AgentSettings(
            node="node-a",
            advertise_addr=f"127.0.0.1:{port}",
            state_dir=state,
            pools={PoolKey("base"): SANDBOXES},
            uid_base=UID_BASE,
            max_sandboxes=SANDBOXES + 4,
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


@pytest.fixture(scope="module")
def sandboxes(sdk: dict[str, Any]) -> Iterator[list[Any]]:
    from e2b import Sandbox

    created: list[Any] = []
    try:
        for _ in range(SANDBOXES):
            created.append(Sandbox.create(**sdk))
        yield created
    finally:
        for sandbox in created:
            sandbox.kill()


def _echo(sandbox: Any, n: int) -> tuple[int, str, str]:
    result = sandbox.commands.run(f"echo {n}-$((40 + 2))")
    return n, sandbox.sandbox_id, result.stdout


def test_twenty_concurrent_commands_across_four_sandboxes(sandboxes: list[Any]) -> None:
    assert len({s.sandbox_id for s in sandboxes}) == SANDBOXES
    with ThreadPoolExecutor(COMMANDS) as pool:
        futures = [pool.submit(_echo, sandboxes[n % SANDBOXES], n) for n in range(COMMANDS)]
        done, pending = wait(futures, timeout=60)
    assert not pending, f"{len(pending)} commands did not finish within 60 s"
    results = sorted(future.result() for future in done)
    assert [n for n, _, _ in results] == list(range(COMMANDS))
    for n, sandbox_id, stdout in results:
        assert stdout == f"{n}-42\n", (n, sandbox_id, stdout)
        assert sandbox_id == sandboxes[n % SANDBOXES].sandbox_id


def test_a_command_past_its_timeout_raises_while_the_others_finish(
    sandboxes: list[Any],
) -> None:
    from e2b.exceptions import TimeoutException

    def slow() -> float:
        begin = time.monotonic()
        try:
            sandboxes[0].commands.run("sleep 60", timeout=2)
        except TimeoutException:
            return time.monotonic() - begin
        raise AssertionError("sleep 60 with timeout=2 returned instead of timing out")

    with ThreadPoolExecutor(COMMANDS + 1) as pool:
        slow_future = pool.submit(slow)
        futures = [pool.submit(_echo, sandboxes[n % SANDBOXES], n) for n in range(COMMANDS)]
        everything: list[Future[Any]] = [slow_future, *futures]
        _, pending = wait(everything, timeout=60)
    assert not pending, f"{len(pending)} calls did not finish within 60 s"
    # The timeout bounded the slow command, not the 60 s sleep.
    assert slow_future.result() < 30
    for future in futures:
        n, _, stdout = future.result()
        assert stdout == f"{n}-42\n"
    # The sandbox that ran the timed-out command still serves commands.
    assert sandboxes[0].commands.run("echo still-here").stdout == "still-here\n"

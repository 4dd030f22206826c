"""Concurrent envd traffic through the proxy with the unmodified e2b SDK: a real host agent
(bubblewrap sandboxes, envd served by the agent), the mesh inventory, the store, the e2b
API and the envd proxy, all on loopback. Skipped when sandboxes cannot run."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import pytest

from tests.conftest import process_slot
from tests.proxy.sdk_stack import sdk_stack, skip_reason

KEY = "e2b_" + "d" * 40
SECRET = b"envd-secret-for-proxy-concurrency-tests"
# A uid block of its own, clear of test_sdk.py's (2_000_000 + ... * 20 < 2_020_000).
UID_BASE = 2_100_000 + process_slot() * 20
SANDBOXES = 4
COMMANDS = 20


@pytest.fixture(scope="module")
def sdk() -> Iterator[dict[str, Any]]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with sdk_stack(
        key=KEY,
        secret=SECRET,
        uid_base=UID_BASE,
        warm=SANDBOXES,
        prefix="sandboxctl-proxy-concurrency-",
    ) as params:
        yield params


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

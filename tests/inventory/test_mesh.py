"""Mesh mode against real agents: two in-process sandboxd agents on loopback ports.

Each agent runs real bubblewrap sandboxes, so these tests need root and bubblewrap (the
same check as tests/sandboxd); the tests that need no agent run everywhere. Time moves
only through ManualClocks and ``poll_once()``: no test sleeps to let time pass.
"""

from __future__ import annotations

import logging
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from sandboxctl.agentapi import (
    AgentAnswerError,
    AgentClient,
    AgentInfo,
    ClaimRequest,
    SandboxList,
    SandboxRow,
)
from sandboxctl.clock import ManualClock
from sandboxctl.core.errors import ConfigurationError
from sandboxctl.core.freshness import FreshnessRule, NodeState
from sandboxctl.core.model import Entry, Metadata, Pool
from sandboxctl.core.snapshot import FleetView
from sandboxctl.core.wire import WireError
from sandboxctl.inventory import InventorySource
from sandboxctl.inventory.mesh import (
    START_SECONDS,
    MeshInventorySource,
    MeshStartError,
)
from sandboxctl.sandboxd.agent import Agent, AgentSettings
from sandboxctl.sandboxd.api import create_app
from tests.sandboxd.conftest import BASE, T0
from tests.sandboxd.servers import free_port, sandboxes_unavailable, wait_until

ROOT = "mesh-root-token-for-tests"
POLL = timedelta(seconds=30)  # long: the background thread never ticks during a test
RULE = FreshnessRule(stale_after=timedelta(seconds=90), publish_interval=POLL)
LOGGER = "sandboxctl.inventory.mesh"


needs_sandboxes = pytest.mark.skipif(
    sandboxes_unavailable() is not None, reason=str(sandboxes_unavailable())
)


class Host:
    """One real agent on a fixed loopback port, whose server can go down and come back."""

    def __init__(
        self, node: str, token: str | None, uid_base: int, advertise: str | None = None
    ) -> None:
        from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime

        self.node = node
        self.token = token
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.state_dir = Path(tempfile.mkdtemp(prefix="sandboxctl-mesh-test-", dir="/tmp"))
        self.state_dir.chmod(0o711)  # every sandbox uid must traverse it
        settings = AgentSettings(
            node=node,
            advertise_addr=self.address if advertise is None else advertise,
            state_dir=self.state_dir,
            pools={BASE: 1},  # a target the info answer reports; never refilled here
            max_sandboxes=4,
            uid_base=uid_base,
        )
        self.agent = Agent(settings, BubblewrapRuntime(), ManualClock(T0))
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def up(self) -> None:
        config = uvicorn.Config(
            create_app(self.agent, self.token),
            host="127.0.0.1",
            port=self.port,
            log_level="error",
            lifespan="off",
            loop="asyncio",
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, name=f"agent-{self.node}", daemon=True)
        thread.start()
        wait_until(lambda: server.started or not thread.is_alive(), what=f"{self.node} to listen")
        assert server.started, f"{self.node} could not listen on {self.address}"
        self._server, self._thread = server, thread

    def down(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            assert not self._thread.is_alive(), f"{self.node} did not stop serving"
        self._server = self._thread = None

    def close(self) -> None:
        try:
            self.down()
        finally:
            self.agent.stop(destroy=True)
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def client(self) -> AgentClient:
        return AgentClient(self.address, ROOT if self.token else None)


MakeHost = Callable[..., Host]


@pytest.fixture
def make_host(uid_base: int) -> Iterator[MakeHost]:  # uid_base: tests/conftest.py
    hosts: list[Host] = []

    def make(node: str, token: str | None = ROOT, advertise: str | None = None) -> Host:
        # Two hosts share this test's block of 20 uids: 4 sandboxes each at most.
        host = Host(node, token, uid_base + 10 * len(hosts), advertise)
        hosts.append(host)
        host.up()
        return host

    yield make
    for host in hosts:
        host.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0, monotonic=1000.0)


@pytest.fixture
def sources() -> Iterator[Callable[..., MeshInventorySource]]:
    made: list[MeshInventorySource] = []

    def make(seeds: Sequence[str], token: str | None = ROOT, **kwargs: Any) -> MeshInventorySource:
        source = MeshInventorySource(seeds, token, **kwargs)
        made.append(source)
        return source

    yield make
    for source in made:
        source.stop()


@pytest.fixture
def hung() -> Iterator[str]:
    """An address that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def _view(source: MeshInventorySource, clock: ManualClock) -> FleetView:
    return source.snapshot().view(RULE, clock.now(), clock.monotonic())


def _names(view: FleetView, node: str) -> list[str]:
    inventory = view.inventory(node)
    assert inventory is not None, f"{node} is not fresh"
    return [entry.name for entry in inventory.entries]


def _mesh_threads(source: MeshInventorySource) -> list[threading.Thread]:
    """This source's poller, if it runs (other tests may run sources of their own)."""
    return [t for t in threading.enumerate() if t is source._thread]


# --- start() and what it lists ---------------------------------------------------------


@needs_sandboxes
def test_start_lists_both_nodes_with_their_entries(
    make_host: MakeHost,
    sources: Callable[..., MeshInventorySource],
    clock: ManualClock,
) -> None:
    a, b = make_host("node-a"), make_host("node-b")
    with a.client() as on_a, b.client() as on_b:
        x_on_a = on_a.claim(
            ClaimRequest("base", claim_ref="default/x", metadata={"k": "v"}, ttl_seconds=120)
        )
        anonymous = on_a.claim(ClaimRequest("base"))
        x_on_b = on_b.claim(ClaimRequest("base", claim_ref="default/x"))
        paused = on_b.claim(ClaimRequest("base", claim_ref="team/y"))
        on_b.hibernate(paused.id)

    source = sources([a.address, b.address], poll_interval=POLL, clock=clock)
    assert isinstance(source, InventorySource)
    source.start()
    assert [t.is_alive() for t in _mesh_threads(source)] == [True]

    view = _view(source, clock)
    assert view.fresh_nodes() == ["node-a", "node-b"]
    inventory_a = view.inventory("node-a")
    assert inventory_a is not None
    assert (inventory_a.address, inventory_a.published_at) == (a.address, T0)
    assert inventory_a.pools == (Pool(BASE, warm=0, target=1),)
    assert _names(view, "node-a") == sorted(["default/x", anonymous.id])
    assert _names(view, "node-b") == ["default/x", "team/y"]
    assert [located.node for located in view.lookup_name("default", "x")] == ["node-a", "node-b"]

    x = view.lookup_name("default", "x")[0].entry
    assert x == Entry(
        name="default/x",
        phase="Running",
        id=x_on_a.id,
        template="base",
        claim_ref="default/x",
        deadline=T0 + timedelta(seconds=120),
        claimed_at=T0,
        metadata=Metadata.parse('{"k":"v"}'),
        cpu_count=1,
        memory_bytes=512 << 20,
    )
    by_id = view.lookup_claim_id(anonymous.id)
    assert by_id is not None
    assert (by_id.node, by_id.entry.name, by_id.entry.claim_ref) == (
        "node-a",
        anonymous.id,
        anonymous.id,
    )
    y = view.lookup_name("team", "y")
    assert [(loc.node, loc.entry.phase) for loc in y] == [("node-b", "Hibernated")]
    assert source.polls == 1
    assert source.failures == {a.address: 0, b.address: 0}

    # A release and a new claim show on the next tick, stamped at that tick.
    with a.client() as on_a, b.client() as on_b:
        on_a.release(x_on_a.id)
        on_b.claim(ClaimRequest("base", claim_ref="team/z"))
    clock.advance(POLL)
    assert all(result.ok for result in source.poll_once())
    view = _view(source, clock)
    assert _names(view, "node-a") == [anonymous.id]
    assert _names(view, "node-b") == ["default/x", "team/y", "team/z"]
    assert [loc.entry.id for loc in view.lookup_name("default", "x")] == [x_on_b.id]
    assert view.inventory("node-b").published_at == T0 + POLL  # type: ignore[union-attr]

    started = time.monotonic()
    source.stop()
    assert time.monotonic() - started < 5, "stop() waited out the poll interval"
    assert _mesh_threads(source) == []


@needs_sandboxes
def test_the_background_thread_polls_on_its_own(
    make_host: MakeHost, sources: Callable[..., MeshInventorySource]
) -> None:
    a = make_host("node-a")
    source = sources([a.address], poll_interval=timedelta(milliseconds=100))
    source.start()
    with a.client() as on_a:
        on_a.claim(ClaimRequest("base", claim_ref="default/late"))

    def listed() -> bool:
        record = source.snapshot().record("node-a")
        return record is not None and [e.name for e in record.inventory.entries] == ["default/late"]

    wait_until(listed, timeout=10, what="the poller to list the new claim")
    # An answer is swapped in before its tick is counted: wait for the count too.
    wait_until(lambda: source.polls >= 2, timeout=10, what="a second, background tick")


# --- start() refuses a setup that cannot work -------------------------------------------


@needs_sandboxes
@pytest.mark.parametrize("token", ["not-the-root-token", None])
def test_a_seed_refusing_the_token_fails_start_naming_it(
    make_host: MakeHost,
    sources: Callable[..., MeshInventorySource],
    clock: ManualClock,
    token: str | None,
) -> None:
    refusing = make_host("node-a", token=ROOT)
    accepting = make_host("node-b", token=token)  # answers this source: one refusal is enough
    source = sources(
        [accepting.address, refusing.address], token=token, poll_interval=POLL, clock=clock
    )
    with pytest.raises(MeshStartError) as error:
        source.start()
    assert str(error.value) == (
        f"sandboxd seed {refusing.address} refused the token: mesh mode needs the fleet's "
        "root token (--sandboxd-token-file)"
    )
    assert _mesh_threads(source) == []


@needs_sandboxes
def test_a_seed_without_an_advertise_addr_fails_start(
    make_host: MakeHost, sources: Callable[..., MeshInventorySource], clock: ManualClock
) -> None:
    a = make_host("node-a", advertise="")
    source = sources([a.address], poll_interval=POLL, clock=clock)
    with pytest.raises(MeshStartError) as error:
        source.start()
    message = str(error.value)
    assert message.startswith(f"sandboxd seed {a.address} reports no advertise_addr: ")
    assert "\n" not in message


def test_no_seed_answering_fails_start_naming_each(
    sources: Callable[..., MeshInventorySource], clock: ManualClock
) -> None:
    first, second = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    source = sources([first, second], poll_interval=POLL, clock=clock)
    with pytest.raises(MeshStartError) as error:
        source.start()
    assert str(error.value) == (
        f"no sandboxd seed answered: {first} (connection refused), {second} (connection refused)"
    )
    assert _mesh_threads(source) == []
    assert len(source.snapshot()) == 0


def test_a_hung_seed_alone_fails_start_once_the_start_wait_is_over(
    sources: Callable[..., MeshInventorySource], clock: ManualClock, hung: str
) -> None:
    source = sources([hung], poll_interval=timedelta(seconds=1), clock=clock)
    started = time.monotonic()
    with pytest.raises(MeshStartError) as error:
        source.start()
    assert time.monotonic() - started < START_SECONDS + 1.5
    assert str(error.value) == f"no sandboxd seed answered: {hung} (no answer within 3s)"


def test_a_seed_slower_than_the_poll_interval_at_first_still_starts(
    sources: Callable[..., MeshInventorySource], clock: ManualClock
) -> None:
    info = {"node": "n1", "advertise_addr": "10.0.0.1:7777"}

    class SlowAtFirst(_FakeClient):
        calls = 0

        def info(self) -> AgentInfo:
            SlowAtFirst.calls += 1
            if SlowAtFirst.calls == 1:
                time.sleep(0.3)  # the agent busy starting its pools: 3 ticks of 100 ms
            return super().info()

    source = sources(
        ["10.0.0.1:7777"],
        poll_interval=timedelta(milliseconds=100),
        clock=clock,
        client_factory=lambda _: SlowAtFirst(info, []),
    )
    source.start()
    try:
        assert source.snapshot().nodes == ("n1",)
    finally:
        source.stop()


class _FakeClient:
    """Answers as an agent would, read through the models as the real client reads them
    (an answer that does not fit is the client's AgentAnswerError)."""

    def __init__(self, info: Mapping[str, Any], rows: Sequence[Any]) -> None:
        self._info, self._rows = info, rows

    def info(self) -> AgentInfo:
        return _answer(AgentInfo, self._info)

    def sandboxes(self) -> Sequence[SandboxRow]:
        return _answer(SandboxList, {"sandboxes": self._rows}).sandboxes

    def close(self) -> None:
        pass


def _answer(model: Any, value: object) -> Any:
    try:
        return model.from_json(value)
    except WireError as error:
        raise AgentAnswerError(error.field, error.problem) from None


def test_a_seed_with_an_unreadable_answer_fails_start(
    sources: Callable[..., MeshInventorySource], clock: ManualClock
) -> None:
    info = {"node": "n1", "advertise_addr": "10.0.0.1:7777"}
    source = sources(
        ["10.0.0.1:7777"],
        poll_interval=POLL,
        clock=clock,
        client_factory=lambda _: _FakeClient(info, [{"id": "sb_1"}]),
    )
    with pytest.raises(MeshStartError) as error:
        source.start()
    assert str(error.value) == (
        "sandboxd seed 10.0.0.1:7777 gave an answer mesh mode cannot read: "
        "sandboxes[0].key: expected an object, got null"
    )


def test_settings_that_cannot_work_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="at least one sandboxd seed"):
        MeshInventorySource([" ", ""], ROOT)
    with pytest.raises(ConfigurationError, match="must be positive"):
        MeshInventorySource(["a:7777"], ROOT, poll_interval=timedelta(0))


# --- a node that stops answering ---------------------------------------------------------


@needs_sandboxes
def test_a_silent_node_keeps_its_last_inventory_until_stale_then_returns(
    make_host: MakeHost,
    sources: Callable[..., MeshInventorySource],
    clock: ManualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    a, b = make_host("node-a"), make_host("node-b")
    with a.client() as on_a, b.client() as on_b:
        on_a.claim(ClaimRequest("base", claim_ref="default/x"))
        on_b.claim(ClaimRequest("base", claim_ref="default/x"))
    source = sources([a.address, b.address], poll_interval=POLL, clock=clock)
    source.start()
    caplog.set_level(logging.INFO, logger=LOGGER)

    b.down()
    for _ in range(3):  # 90 s: B trails A by exactly stale-after, still fresh
        clock.advance(POLL)
        assert [r.ok for r in source.poll_once()] == [True, False]
    view = _view(source, clock)
    assert view.fresh_nodes() == ["node-a", "node-b"]
    assert view.age("node-b") == timedelta(seconds=90)

    clock.advance(POLL)  # 120 s: past the window
    assert [r.ok for r in source.poll_once()] == [True, False]
    view = _view(source, clock)
    assert view.fresh_nodes() == ["node-a"]
    assert view.state("node-b") is NodeState.STALE
    assert [loc.node for loc in view.lookup_name("default", "x")] == ["node-a"]
    kept = source.snapshot().record("node-b")
    assert kept is not None, "the silent node's last inventory was dropped"
    assert kept.inventory.published_at == T0
    assert [e.name for e in kept.inventory.entries] == ["default/x"]
    assert view.inventory("node-a").published_at == T0 + 4 * POLL  # type: ignore[union-attr]
    assert source.failures == {a.address: 0, b.address: 4}
    # Only this source's agents: a session-wide fleet elsewhere logs to the same logger.
    warnings = [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING
        and (a.address in r.getMessage() or b.address in r.getMessage())
    ]
    assert len(warnings) == 1, "warn once per failure streak, not every tick"
    assert b.address in warnings[0].getMessage()
    assert "node-b keeps its last inventory" in warnings[0].getMessage()

    b.up()
    clock.advance(POLL)
    assert [r.ok for r in source.poll_once()] == [True, True]
    view = _view(source, clock)
    assert view.fresh_nodes() == ["node-a", "node-b"]
    assert view.inventory("node-b").published_at == T0 + 5 * POLL  # type: ignore[union-attr]
    assert [loc.node for loc in view.lookup_name("default", "x")] == ["node-a", "node-b"]
    assert any(
        "answers again after 4 failed polls" in r.getMessage()
        for r in caplog.records
        if r.levelno == logging.INFO
    )


@needs_sandboxes
def test_a_poller_that_loses_every_node_keeps_everyone(
    make_host: MakeHost, sources: Callable[..., MeshInventorySource], clock: ManualClock
) -> None:
    a, b = make_host("node-a"), make_host("node-b")
    with a.client() as on_a, b.client() as on_b:
        on_a.claim(ClaimRequest("base", claim_ref="default/x"))
        on_b.claim(ClaimRequest("base", claim_ref="default/y"))
    source = sources([a.address, b.address], poll_interval=POLL, clock=clock)
    source.start()

    a.down()
    b.down()
    for _ in range(20):  # ten minutes of ticks in which nobody answers
        clock.advance(POLL)
        assert [r.ok for r in source.poll_once()] == [False, False]
    assert clock.now() - T0 == timedelta(minutes=10)
    view = _view(source, clock)
    assert view.fresh_nodes() == ["node-a", "node-b"], "every stamp froze together"
    assert [loc.entry.name for loc in view.entries()] == ["default/x", "default/y"]

    # A answers again: the ten silent minutes are credited to B, not held against it...
    a.up()
    clock.advance(POLL)
    assert [r.ok for r in source.poll_once()] == [True, False]
    view = _view(source, clock)
    assert view.fresh_nodes() == ["node-a", "node-b"]
    assert view.age("node-b") == POLL
    # ...but B gets no more than that: past the window from here it goes stale.
    for _ in range(3):
        clock.advance(POLL)
        source.poll_once()
    assert _view(source, clock).fresh_nodes() == ["node-a"]


# --- a node that hangs --------------------------------------------------------------------


@needs_sandboxes
def test_a_hung_node_cannot_stall_a_tick(
    make_host: MakeHost,
    sources: Callable[..., MeshInventorySource],
    clock: ManualClock,
    hung: str,
) -> None:
    a = make_host("node-a")
    tick = timedelta(seconds=1)
    source = sources([a.address, hung], poll_interval=tick, clock=clock)
    for _ in range(3):
        started = time.monotonic()
        results = source.poll_once()
        elapsed = time.monotonic() - started
        assert elapsed < 1.5, f"a tick took {elapsed:.2f}s with a 1s poll interval"
        assert results[0].ok
        assert not results[1].ok
        assert results[1].reason in (
            "no answer within 1s",
            "its previous poll has not answered yet",
            "timed out",
        )
        clock.advance(tick)
    assert source.failures == {a.address: 0, hung: 3}
    assert source.snapshot().nodes == ("node-a",)

    # While a tick waits on the hung node, snapshot() answers at once.
    ticking = threading.Thread(target=source.poll_once)
    ticking.start()
    try:
        started = time.monotonic()
        for _ in range(100):
            assert source.snapshot().nodes == ("node-a",)
        assert time.monotonic() - started < 0.1
    finally:
        ticking.join(timeout=5)


def test_each_poll_answer_notifies_the_subscribers_until_they_unsubscribe(
    sources: Callable[..., MeshInventorySource], clock: ManualClock
) -> None:
    info = {"node": "n1", "advertise_addr": "10.0.0.1:7777"}
    source = sources(
        ["10.0.0.1:7777"],
        poll_interval=POLL,
        clock=clock,
        client_factory=lambda _: _FakeClient(info, []),
    )
    seen: list[tuple[str, ...]] = []
    unsubscribe = source.subscribe(lambda: seen.append(source.snapshot().nodes))
    assert all(result.ok for result in source.poll_once())
    assert seen == [("n1",)]  # called after the swap: the listener reads the new snapshot
    unsubscribe()
    source.poll_once()
    assert seen == [("n1",)]

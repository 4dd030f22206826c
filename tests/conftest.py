"""Fixtures every test package may use."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandboxctl.sandboxd.procfs import pids_of_uids
from sandboxctl.sandboxd.runtimedir import RUNTIME_ROOT_ENV
from sandboxctl.sandboxd.templates.store import STORE_ENV
from tests.testing.realkube import (  # noqa: F401
    _real_kube,
    control_plane,
    real_kube,
    uncached_kube,
)

_uid_blocks = itertools.count()
# Session fixtures each xdist worker has its own, and keeps to the session's end: those
# every test uses (autouse), and the real control plane (tests/testing/realkube.py), which
# any worker's Kubernetes tests share rather than wait for one worker.
_EVERYWHERE = {"runtime_root", "template_store", "control_plane", "_real_kube"}
TESTS = Path(__file__).parent

# What a test needs beyond its own process, as the markers pyproject.toml registers: root
# (real sandboxes), netns (network namespaces) and services (it spawns processes, or serves
# or connects on loopback). Given by the folder or module where every test needs the same,
# by the fixtures that bring it (their defining module and name), and, for a few tests in
# otherwise pure modules, by a mark of their own; a test of a session-scoped stack needs
# services too. `make check` runs the tests that need none.
FOLDER_NEEDS: dict[str, frozenset[str]] = {  # the deepest folder named wins
    "sandboxd": frozenset({"root", "services"}),
    "sandboxd/network": frozenset({"root", "netns", "services"}),
    "sandboxd/templates": frozenset({"root", "services"}),
    "fleet": frozenset({"root", "services"}),
    "fleet/clients": frozenset({"services"}),
    "fleet/kube": frozenset({"services"}),
    "kube": frozenset({"services"}),
    "testing/kubeapi": frozenset({"services"}),
    "testing/controlplane": frozenset({"services"}),
    "relay": frozenset({"services"}),
    "manifests": frozenset({"services"}),  # kubectl against the API double
    "proxy": frozenset({"services"}),
    "publisher": frozenset({"services"}),
    "serving": frozenset({"services"}),
}
MODULE_NEEDS: dict[str, frozenset[str]] = {
    "lanes/test_local.py": frozenset({"root", "netns", "services"}),
    "lanes/test_external_e2e.py": frozenset({"root", "netns", "services"}),
    "lanes/test_external.py": frozenset({"services"}),
    "apiserver/test_auth.py": frozenset({"services"}),
    "apiserver/test_cli.py": frozenset({"services"}),
    "apiserver/test_fuzz.py": frozenset({"services"}),
    "apiserver/test_kube.py": frozenset({"services"}),
    "apiserver/test_limits.py": frozenset({"services"}),
    "apiserver/test_warmpool.py": frozenset({"services"}),
    "cli/test_interrupt.py": frozenset({"services"}),
    "apiserver/e2b/test_config.py": frozenset({"services"}),
    "apiserver/e2b/test_fuzz.py": frozenset({"services"}),
    "apiserver/e2b/test_http.py": frozenset({"services"}),
    "envd/test_host.py": frozenset({"services"}),
    "guard/test_cli.py": frozenset({"services"}),
    "guard/test_e2e.py": frozenset({"services"}),
    "guard/test_edge_cases.py": frozenset({"services"}),
    "guard/test_manifests.py": frozenset({"services"}),
    "guard/test_upstream.py": frozenset({"services"}),
    "inventory/test_kube.py": frozenset({"services"}),
    "inventory/test_mesh.py": frozenset({"services"}),
    "lifecycle/test_manager.py": frozenset({"services"}),
}
FIXTURE_NEEDS: dict[str, frozenset[str]] = {
    "tests.conftest:uid_base": frozenset({"root"}),
    "tests.guard.conftest:kube": frozenset({"services"}),  # the API double on loopback
    "tests.testing.realkube:control_plane": frozenset({"services"}),
    "tests.testing.realkube:uncached_kube": frozenset({"services"}),
    "tests.guard.test_karpenter:karpenter_plane": frozenset({"services"}),
}


def _stacks(item: pytest.Item) -> list[Any]:
    """The definitions of the session-scoped stacks ``item`` uses (an e2b stack, envd's
    agent, the proxy's SDK stack, the API server's agents, the clients' fleet)."""
    definitions = item._fixtureinfo.name2fixturedefs  # type: ignore[attr-defined]
    return [
        definition
        for name in item.fixturenames
        if name not in _EVERYWHERE
        for definition in definitions.get(name, ())
        if definition.scope == "session" and definition.func.__module__.startswith("tests.")
    ]


def _group(item: pytest.Item) -> str:
    marker = item.get_closest_marker("xdist_group")
    return str(marker.args[0]) if marker else item.nodeid.split("::")[0]


def needs_of(item: pytest.Item) -> frozenset[str]:
    """The markers of what ``item`` needs beyond its own process (empty: a pure test)."""
    where = item.path.relative_to(TESTS)
    folders = ("/".join(where.parts[:depth]) for depth in range(len(where.parts) - 1, 0, -1))
    needs = set(next((FOLDER_NEEDS[f] for f in folders if f in FOLDER_NEEDS), ()))
    needs |= MODULE_NEEDS.get(where.as_posix(), frozenset())
    definitions = item._fixtureinfo.name2fixturedefs  # type: ignore[attr-defined]
    for name in item.fixturenames:
        for definition in definitions.get(name, ())[-1:]:  # the one in effect here
            needs |= FIXTURE_NEEDS.get(f"{definition.func.__module__}:{name}", frozenset())
    if _stacks(item):
        needs.add("services")
    return frozenset(needs)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks each test with what it needs (``needs_of``), and groups, for ``pytest -n 2
    --dist loadgroup`` (pytest-xdist), which runs each group on one worker: a module's
    tests together (its module fixtures start once), and every test of a session-scoped
    stack together (where the stack's fixtures are defined names the group), so that one
    worker starts it, not each. The tests of a group run one after another (the first test
    of a group sets its place), so that a stack is stopped after its group's last test
    (below) rather than kept busy until the session ends."""
    for item in items:
        for need in sorted(needs_of(item)):
            item.add_marker(need)
        stacks = {definition.func.__module__ for definition in _stacks(item)}
        group = min(stacks) if stacks else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
    place: dict[str, int] = {}
    for item in items:
        place.setdefault(_group(item), len(place))
    items.sort(key=lambda item: place[_group(item)])  # stable: the order within a group


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Stop a session-scoped stack after the last test of its group: its agents' loops and
    inventory polls would otherwise take CPU from every later test. (A later test that
    asked for it again would start it again.)"""
    yield
    if nextitem is None or _group(nextitem) == _group(item):
        return  # the session's end stops what is left
    for definition in _stacks(item):
        definition.finish(item._request)  # type: ignore[attr-defined]


@pytest.fixture(scope="session", autouse=True)
def runtime_root() -> Iterator[Path]:
    """The runtime root of every fleet and agent this session starts (serve and
    serve-sandboxd read SANDBOXCTL_RUNTIME_ROOT, and their processes inherit it): a
    traversable temporary directory, never the host's /var/lib/sandboxctl/runtime, which a
    ``make serve`` running beside the tests uses. Removed at the end."""
    path = Path(tempfile.mkdtemp(prefix="sandboxctl-runtime-", dir="/tmp"))
    path.chmod(0o711)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(RUNTIME_ROOT_ENV, str(path))
        yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def template_store() -> Iterator[Path]:
    """The template store of every fleet and agent this session starts (serve,
    serve-sandboxd and ``template`` read SANDBOXCTL_TEMPLATE_STORE): a traversable
    temporary directory, never the host's /var/lib/sandboxctl/templates. Empty until a
    test seeds it from the machine's template cache (tests/sandboxd/templates/cache.py)."""
    path = Path(tempfile.mkdtemp(prefix="sandboxctl-templates-", dir="/tmp"))
    path.chmod(0o711)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(STORE_ENV, str(path))
        yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A state dir every sandbox uid can traverse (pytest's tmp_path is 0700 for root)."""
    path = Path(tempfile.mkdtemp(prefix="sandboxctl-test-", dir="/tmp"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def process_slot() -> int:
    """This test process's slot of 1000: per session (its pid), and distinct for each
    pytest-xdist worker of one session (workers are numbered from the session's pid)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ... under xdist
    if worker is None:
        return os.getpid() % 1000
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return (os.getppid() * workers + int(worker.removeprefix("gw"))) % 1000


@pytest.fixture
def uid_base() -> Iterator[int]:
    # Unique per test, per test session and per xdist worker: destroy also kills every
    # process of a sandbox's uid, so two test processes must never share a uid. A block
    # of 20 per test (a kube fleet's third node reaches +88), reused in turn within the
    # process's 1000, as tests before have cleaned up theirs: which the teardown checks.
    base = 400_000 + process_slot() * 1000 + (20 * next(_uid_blocks)) % 900
    yield base
    uids = range(base, base + UID_REACH)
    deadline = time.monotonic() + 10
    while (left := pids_of_uids(uids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if left:
        pytest.fail(f"the test left sandbox processes behind (pid: uid): {left}")


UID_REACH = 100  # the most uids above its base a test gives sandboxes

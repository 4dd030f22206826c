"""Fixtures every test package may use."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxctl.sandboxd.runtimedir import RUNTIME_ROOT_ENV
from sandboxctl.sandboxd.templates.store import STORE_ENV

_uid_blocks = itertools.count()


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
    test seeds it from the machine's template cache (tests/templates/cache.py)."""
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


@pytest.fixture
def uid_base() -> int:
    # Unique per test and per test session: destroy also kills every process of a
    # sandbox's uid, so two sessions must never share a uid.
    return 400_000 + (os.getpid() % 1000) * 1000 + 20 * next(_uid_blocks)

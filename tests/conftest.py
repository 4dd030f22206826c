"""Fixtures every test package may use."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

_uid_blocks = itertools.count()


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

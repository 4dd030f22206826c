from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxctl.sandboxd.templates.store import Template
from tests.cli.conftest import run  # noqa: F401 (the in-process `sandboxctl` fixture)
from tests.sandboxd.templates.cache import seed


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Building needs root (mmdebstrap's root mode, the store is root's): say so.
    if os.geteuid() == 0:
        return
    for item in items:
        if "tests/sandboxd/templates" in str(item.fspath):
            item.add_marker(pytest.mark.skip(reason="template builds run as root"))


@pytest.fixture
def store() -> Iterator[Path]:
    """A store of this test's own (sandbox uids may traverse it), empty."""
    path = Path(tempfile.mkdtemp(prefix="sandboxctl-store-", dir="/tmp"))
    path.chmod(0o711)
    yield path
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


@pytest.fixture
def default(store: Path) -> Template:
    """``store`` with serve's default template (from the machine's template cache)."""
    return seed(store)

from __future__ import annotations

from tests.cli.conftest import run  # noqa: F401 (the in-process `sandboxctl` fixture)

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from sandboxctl.cli.app import main


@dataclass
class Result:
    code: int
    out: str
    err: str


Run = Callable[..., Result]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    """Run ``sandboxctl ARGS`` in-process and return its exit code and output."""

    def invoke(*args: str) -> Result:
        with pytest.raises(SystemExit) as exited:
            main(list(args))
        captured = capsys.readouterr()
        code = exited.value.code
        return Result(code if isinstance(code, int) else 0, captured.out, captured.err)

    return invoke

"""Running a long-lived command's process manager (``lifecycle``) to its end."""

from __future__ import annotations

import typer

from sandboxctl.lifecycle import Manager


def run_until_stopped(manager: Manager) -> None:
    """Run ``manager``, taking the stop signals; a failed run's exit code ends the
    command (an asked stop exits 0)."""
    with manager:
        code = manager.run()
    if code:
        raise typer.Exit(code)

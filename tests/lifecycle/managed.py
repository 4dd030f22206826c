"""One part under a process manager of its own, on a thread: how a command runs it, as a
test starts and stops it."""

from __future__ import annotations

import threading

from sandboxctl.lifecycle import Manager, Runnable

JOIN_TIMEOUT = 30.0


class Managed:
    def __init__(self, part: Runnable) -> None:
        self.manager = Manager()
        self.manager.add(part)
        self.codes: list[int] = []  # the manager's exit code, once it returned
        self._thread = threading.Thread(
            target=lambda: self.codes.append(self.manager.run()), name=part.name, daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the part (safe before a start) and wait for the manager to return."""
        self.manager.stop()
        if self._thread.is_alive():
            self._thread.join(timeout=JOIN_TIMEOUT)

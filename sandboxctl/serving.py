"""Run an ASGI app with uvicorn until SIGINT or SIGTERM, then return to the caller.

uvicorn re-raises the stop signal once it has shut down, which ends the process before
the caller can stop its own loops (and exits with -15, not 0). Every long-lived sandboxctl
service serves through here instead, so shutdown code after it always runs.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

import uvicorn

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def run_server(app: Any, host: str, port: int) -> None:
    """Serve until a stop signal; returns normally after a graceful shutdown."""
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, lifespan="off"
    )
    _Server(config).run()

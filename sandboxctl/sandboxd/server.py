"""Serve one agent over HTTP under a process manager until SIGTERM or SIGINT; sandboxes
outlive the server."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

from sandboxctl.lifecycle import Group, Manager
from sandboxctl.sandboxd.agent import Agent
from sandboxctl.sandboxd.api import create_app
from sandboxctl.serving import Served
from sandboxctl.serving.bounds import ReadBounds

log = logging.getLogger("sandboxctl.sandboxd")


def serve(
    agent: Agent,
    sock: socket.socket,
    root_token: str | None,
    destroy_on_exit: bool,
    bounds: ReadBounds | None = None,
    started: Callable[[], None] = lambda: None,
) -> int:
    """Adopt, call ``started``, serve on the bound ``sock`` within ``bounds`` and run the
    agent's loops; on a stop signal close the listener and stop the loops, then the agent
    (destroying its sandboxes with ``destroy_on_exit``). The exit code (the manager's). A signal
    before the API listens has its default action (docs/sandboxd.md)."""
    report = agent.start()
    started()  # the start has succeeded: what only a successful start may change
    host, port = sock.getsockname()[:2]
    log.info(
        "node %s serving on %s:%d (runtime %s, limits %s); adopted %d, cleaned up %d",
        agent.settings.node,
        host,
        port,
        agent.runtime.name,
        agent.runtime.limits_mode,
        len(report.adopted),
        len(report.cleaned),
    )
    manager = Manager()
    manager.add(Served([(create_app(agent, root_token), sock)], bounds=bounds), Group.SERVERS)
    for loop in agent.loops():  # stopped before the agent destroys anything
        manager.add(loop)
    with manager:
        try:
            return manager.run()
        finally:
            agent.stop(destroy=destroy_on_exit)
            log.info("stopped; sandboxes %s", "destroyed" if destroy_on_exit else "left running")

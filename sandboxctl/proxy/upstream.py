"""The proxy's hop to the agents: ``relay.Upstream`` (see ``sandboxctl/relay``), kept per
agent address. Unlike a relay opened per sandbox, a kept connection here
goes to the agent's API, which serves all of its sandboxes, so it holds no sandbox open.
An idle connection is closed after ``idle_seconds`` (well inside uvicorn's 5 s keep-alive,
so an agent does not close one as it is reused), when the agent hangs up, and when the
event loop shuts down (the sweeper task is cancelled then), so nothing is left open at
exit.
"""

from __future__ import annotations

from sandboxctl.relay import IDLE_SECONDS, MAX_IDLE_PER_AGENT, Upstream, UpstreamError, authority

__all__ = ["IDLE_SECONDS", "MAX_IDLE_PER_AGENT", "Upstream", "UpstreamError", "authority"]

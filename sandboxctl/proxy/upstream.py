"""The proxy's hop to the agents: HTTP/1.1 over kept-alive connections, bodies streamed.

A relayed request is one exchange: write the request head, stream the body, read the
response head, then hand the body on chunk by chunk as it arrives. Responses are parsed
with ``httptools`` (the C parser uvicorn serves with). httpx did the same job at about
60 % of the proxy's CPU per request (its anyio streams, pool liveness checks and cookie
handling), which alone cost more than the 1 ms the proxy may add.

The pool itself is `relay.Upstream`, shared with the agent's guest ports. Connections are
kept per agent address. Unlike the reference fleet's per-sandbox relays,
a kept connection here goes to the agent's API, which serves all of its sandboxes, so it
holds no sandbox open. An idle connection is closed after ``idle_seconds`` (well inside
uvicorn's 5 s keep-alive, so an agent does not close one as it is reused), when the agent
hangs up, and when the event loop shuts down (the sweeper task is cancelled then), so
nothing is left open at exit.
"""

from __future__ import annotations

from sandboxctl.relay import IDLE_SECONDS, MAX_IDLE_PER_AGENT, Upstream, UpstreamError, authority

__all__ = ["IDLE_SECONDS", "MAX_IDLE_PER_AGENT", "Upstream", "UpstreamError", "authority"]

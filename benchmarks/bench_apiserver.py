"""The Sandbox API's token check: what authenticating a request costs.

- ``token lookup (N tokens)``: ``KubeTokens.namespaces`` for a known token, with 1 and
  with 1000 tokens in the file (one SHA-256 and one dictionary lookup: the count should
  not matter);
- ``token check per request``: the ``Authenticated`` middleware around an ASGI app that
  answers at once, called in-process for a namespaced path, minus the same app called
  without it (both p50 over the same number of calls, side by side); the row's ``ratio``
  is the checked call over the bare one;
- ``refused (401) per request``: a request with an unknown token, answered by the
  middleware itself.

The figure that matters is the per-request difference, in microseconds.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from typing import Any

from benchmarks import Row, with_target
from benchmarks.timing import Timing, measure
from sandboxctl.apiserver.auth import ALL_NAMESPACES, Authenticated, KubeTokens

NAME = "apiserver"
CALLS = 20_000
CHECK_TARGET_US = 10.0
PATH = "/apis/agents.x-k8s.io/v1beta1/namespaces/team-a/sandboxes"


def run() -> Iterator[Row]:
    for count in (1, 1000):
        tokens, token = _tokens(count)
        offered = token.encode()
        timing = measure(lambda t=tokens, o=offered: t.namespaces(o), runs=CALLS, warmup=100)
        yield _row(f"token lookup ({count} tokens)", **timing.figures("us"))

    tokens, token = _tokens(1000)
    checked = Authenticated(_answer, tokens)
    bare = _per_call(_answer, token)
    with_check = _per_call(checked, token)
    refused = _per_call(checked, "not-a-token")
    cost = (with_check.p50_ns - bare.p50_ns) / 1000
    yield _row("bare ASGI call (baseline)", **bare.figures("us"))
    row = _row(
        "token check per request",
        **with_check.figures("us"),
        check_us=round(cost, 2),
        ratio=round(with_check.p50_ns / bare.p50_ns, 2),
    )
    yield with_target(row, cost <= CHECK_TARGET_US, f"check <= {CHECK_TARGET_US:g} us")
    yield _row("refused (401) per request", **refused.figures("us"))


def _tokens(count: int) -> tuple[KubeTokens, str]:
    grants = {secrets.token_urlsafe(32): frozenset({"team-a"}) for _ in range(count - 1)}
    token = secrets.token_urlsafe(32)
    grants[token] = frozenset({ALL_NAMESPACES})
    return KubeTokens(grants), token


async def _answer(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def _per_call(app: Any, token: str) -> Timing:
    """p50 and p99 of one request through ``app``, in-process, over CALLS requests."""
    scope = {
        "type": "http",
        "method": "GET",
        "path": PATH,
        "headers": [(b"authorization", f"Bearer {token}".encode()), (b"accept", b"*/*")],
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        return None

    async def calls() -> list[float]:
        samples = []
        for _ in range(CALLS):
            start = time.perf_counter_ns()
            await app(scope, receive, send)
            samples.append(time.perf_counter_ns() - start)
        return samples

    return Timing(tuple(sorted(asyncio.run(calls()))))


def _row(case: str, **figures: object) -> Row:
    return {"benchmark": NAME, "case": case, **figures}

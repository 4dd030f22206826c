"""A sandbox's usage and log: ``GET /sandboxes/metrics`` (several at once),
``/sandboxes/{id}/metrics``, ``/sandboxes/{id}/logs`` and ``/v2/sandboxes/{id}/logs``."""

from __future__ import annotations

import asyncio

from fastapi import Request
from starlette.responses import Response

from sandboxctl.agentapi import LogEvent
from sandboxctl.apiserver.e2b.logs import (
    SandboxLogEntry,
    SandboxLogLine,
    SandboxLogs,
    SandboxLogsV2,
    parse_v1,
    parse_v2,
    select,
)
from sandboxctl.apiserver.e2b.metrics import (
    SandboxesWithMetrics,
    SandboxMetric,
    parse_sandbox_ids,
    parse_seconds,
)
from sandboxctl.apiserver.e2b.service import E2bError, E2bService, Service, Tenant, not_found
from sandboxctl.core.ids import SandboxId
from sandboxctl.serving.apps import answer


async def many_metrics(e2b: Service, namespace: Tenant, sandbox_ids: str | None = None) -> Response:
    """The newest sample of each; an id that is unknown, gone or another key's is left
    out, as upstream leaves it."""
    wanted = parse_sandbox_ids(sandbox_ids)

    async def newest(sandbox_id: str) -> tuple[str, SandboxMetric | None]:
        try:
            located = await e2b.locate(namespace, sandbox_id)
            samples = await e2b.call(e2b.store.usage, located, latest=True)
        except E2bError as error:
            if error.status == 404:
                return sandbox_id, None
            raise
        metric = SandboxMetric.of(samples[-1]) if samples else None
        return SandboxId.of_claim(located.entry.id).public, metric

    found = await asyncio.gather(*(newest(sandbox_id) for sandbox_id in wanted))
    return answer(SandboxesWithMetrics({sid: metric for sid, metric in found if metric}))


async def sandbox_metrics(
    e2b: Service,
    namespace: Tenant,
    sandbox_id: str,
    start: str | None = None,
    end: str | None = None,
) -> Response:
    window = parse_seconds("start", start), parse_seconds("end", end)
    located = await e2b.locate(namespace, sandbox_id)
    try:
        samples = await e2b.call(e2b.store.usage, located, *window)
    except E2bError as error:
        if error.status == 404:
            raise not_found(sandbox_id) from None
        raise
    return answer([SandboxMetric.of(sample) for sample in samples])


async def logs_v1(request: Request, e2b: Service, namespace: Tenant, sandbox_id: str) -> Response:
    chosen = select(await log_events(e2b, namespace, sandbox_id), parse_v1(request.query_params))
    lines = tuple(map(SandboxLogLine.of, chosen))
    return answer(SandboxLogs(lines, tuple(map(SandboxLogEntry.of, chosen))))


async def logs_v2(request: Request, e2b: Service, namespace: Tenant, sandbox_id: str) -> Response:
    chosen = select(await log_events(e2b, namespace, sandbox_id), parse_v2(request.query_params))
    return answer(SandboxLogsV2(tuple(map(SandboxLogEntry.of, chosen))))


async def log_events(e2b: E2bService, namespace: str, sandbox_id: str) -> list[LogEvent]:
    """The sandbox's log, live or killed; empty for a sandbox whose log no node keeps
    (an older agent); 404 for one that is neither logged nor known to this key."""
    found = await e2b.call(e2b.store.log_of, SandboxId.parse(sandbox_id), namespace)
    if found is not None:
        return list(found.events)
    await e2b.locate(namespace, sandbox_id)
    return []

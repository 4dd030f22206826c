"""Sandboxes: create (``POST /sandboxes``, ``/v2/sandboxes``), the lists (``GET
/sandboxes``, ``/v2/sandboxes``), and one sandbox's reads and verbs (get, kill, network,
timeout, refresh, connect, pause, resume)."""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Annotated, Final

from fastapi import Depends, Query
from msgspec import UNSET
from starlette.responses import Response

from sandboxctl.agentapi import SandboxRow, entry_from_row
from sandboxctl.agentapi.network import NetworkUpdate as AgentNetworkUpdate
from sandboxctl.apiserver.e2b.bodies import (
    ConnectBody,
    NetworkUpdate,
    NewSandbox,
    PauseBody,
    RefreshBody,
    ResumeBody,
    TimeoutBody,
)
from sandboxctl.apiserver.e2b.models import Sandbox, detail_body, listed_body, sandbox_body
from sandboxctl.apiserver.e2b.paging import (
    Filters,
    decode_cursor,
    encode_cursor,
    parse_limit,
    parse_metadata_filter,
    parse_order,
    parse_states,
    parse_time,
    sort_key,
)
from sandboxctl.apiserver.e2b.service import E2bError, E2bService, Service, Tenant
from sandboxctl.core.model import PoolKey
from sandboxctl.core.netpolicy import targets
from sandboxctl.core.snapshot import Located
from sandboxctl.core.wire import encode_listing
from sandboxctl.serving.apps import JSON, answer, body, no_content

NAME_PREFIX: Final = "e2b-"

# Route parameters: each body, read into its shape (the verbs' bodies may be left out).
CreateBody = Annotated[NewSandbox, Depends(body(NewSandbox))]
UpdateBody = Annotated[NetworkUpdate, Depends(body(NetworkUpdate))]
Timeout = Annotated[TimeoutBody, Depends(body(TimeoutBody))]
Refresh = Annotated[RefreshBody, Depends(body(RefreshBody, required=False))]
Connect = Annotated[ConnectBody, Depends(body(ConnectBody, required=False))]
Pause = Annotated[PauseBody, Depends(body(PauseBody, required=False))]
Resume = Annotated[ResumeBody, Depends(body(ResumeBody, required=False))]


async def create(e2b: Service, namespace: Tenant, new: CreateBody) -> Response:
    """A claim: of the alias's pool, else of the template's own (a cold start when no
    node has a warm one); 201 with the ``Sandbox``."""
    network = new.policy()
    pool = await e2b.call(e2b.pool_of, new.templateID)
    if pool is None:
        raise E2bError(404, f"template {new.templateID!r} not found")
    key = PoolKey(pool.template, "egress" if new.allow_internet_access else "none", pool.size)
    granted = await e2b.call(
        e2b.store.claim,
        namespace,
        NAME_PREFIX + secrets.token_hex(5),
        key,
        new.timeout or e2b.config.default_timeout,
        new.metadata,
        "pause" if new.autoPause else "destroy",
        env=new.envVars,
        network=network,
    )
    reply = sandbox_body(
        e2b.config,
        claim_id=granted.claim_id,
        node=granted.node,
        template=key.template,
        claim_token=granted.token,
        requested=new.templateID,
        private=not network.public_traffic,
    )
    return answer(reply, status=201)


async def list_v2(
    e2b: Service,
    namespace: Tenant,
    state: str | None = None,
    metadata: str | None = None,
    template: str | None = None,
    started_after: Annotated[str | None, Query(alias="startedAfter")] = None,
    limit: str | None = None,
    order: str | None = None,
    next_token: Annotated[str | None, Query(alias="nextToken")] = None,
) -> Response:
    """A page of the key's sandboxes, newest first (``X-Next-Token`` for the next)."""
    filters = _filters(e2b, state, metadata, template, started_after)
    cursor = decode_cursor(next_token)
    page = parse_limit(limit), parse_order(order)
    return await _listing(e2b, namespace, filters, cursor, *page)


async def list_v1(
    e2b: Service,
    namespace: Tenant,
    state: str | None = None,
    metadata: str | None = None,
    template: str | None = None,
    started_after: Annotated[str | None, Query(alias="startedAfter")] = None,
    order: str | None = None,
) -> Response:
    """Every one of the key's sandboxes, unpaged."""
    filters = _filters(e2b, state, metadata, template, started_after)
    return await _listing(e2b, namespace, filters, None, None, parse_order(order))


async def get_info(e2b: Service, namespace: Tenant, sandbox_id: str) -> Response:
    """The ``SandboxDetail``, with its state, end and envd token read live."""
    located = await e2b.locate(namespace, sandbox_id)
    row = await e2b.read(located, sandbox_id)
    live = Located(located.node, entry_from_row(row))
    network = row.network or None
    return answer(detail_body(e2b.config, live, e2b.store.now(), row.token or "", network))


async def kill(e2b: Service, namespace: Tenant, sandbox_id: str) -> Response:
    """204; 404 when it is unknown or already gone (so ``kill()`` is True, then False)."""
    located = await e2b.locate(namespace, sandbox_id)
    await e2b.read(located, sandbox_id)  # the inventory may still list one already gone
    await e2b.call(e2b.store.release, located)
    return no_content()


async def set_network(
    e2b: Service, namespace: Tenant, sandbox_id: str, update: UpdateBody
) -> Response:
    """Replace the egress rules, in force before the answer."""
    internet = update.allow_internet_access
    change = AgentNetworkUpdate(
        allow_out=targets(update.allowOut, "allowOut"),
        deny_out=targets(update.denyOut, "denyOut"),
        internet=UNSET if internet is None else internet,
    )
    located = await e2b.locate(namespace, sandbox_id)
    await e2b.call(e2b.store.set_network, located, change)
    return no_content()


async def set_timeout(
    e2b: Service, namespace: Tenant, sandbox_id: str, wanted: Timeout
) -> Response:
    """A lease of ``timeout`` seconds from now: it may shorten the lease."""
    located = await e2b.locate(namespace, sandbox_id)
    await e2b.call(e2b.store.renew, located, wanted.timeout)
    return no_content()


async def refresh(e2b: Service, namespace: Tenant, sandbox_id: str, wanted: Refresh) -> Response:
    located = await e2b.locate(namespace, sandbox_id)
    await e2b.call(e2b.store.renew, located, wanted.duration or e2b.config.default_timeout)
    return no_content()


async def connect(e2b: Service, namespace: Tenant, sandbox_id: str, wanted: Connect) -> Response:
    """Resume it when paused (201, else 200), and extend its lease to ``timeout`` from
    now; a connect never shortens a lease."""
    if not wanted.memory:
        raise E2bError(400, "memory: false (resume by reboot) is not supported")
    timeout = wanted.timeout or e2b.config.default_timeout
    located = await e2b.locate(namespace, sandbox_id)
    row = await e2b.read(located, sandbox_id)
    resumed = row.hibernated
    if resumed:
        await e2b.call(e2b.store.resume, located)
        row = await e2b.read(located, sandbox_id)
    wanted_end = e2b.store.now() + timedelta(seconds=timeout)
    if row.deadline is None or wanted_end > row.deadline:
        await e2b.call(e2b.store.renew, located, timeout)
    return answer(_connected(e2b, located, row), status=201 if resumed else 200)


async def pause(e2b: Service, namespace: Tenant, sandbox_id: str, wanted: Pause) -> Response:
    if not wanted.memory:
        raise E2bError(400, "memory: false (pause without memory) is not supported")
    located = await e2b.locate(namespace, sandbox_id)
    await e2b.call(e2b.store.pause, located)
    return no_content()


async def resume(e2b: Service, namespace: Tenant, sandbox_id: str, wanted: Resume) -> Response:
    """Legacy resume: 201 with the ``Sandbox``."""
    if wanted.autoPause:
        raise E2bError(400, "autoPause: true on resume is not supported")
    located = await e2b.locate(namespace, sandbox_id)
    await e2b.call(e2b.store.resume, located)
    if wanted.timeout:
        await e2b.call(e2b.store.renew, located, wanted.timeout)
    row = await e2b.read(located, sandbox_id)
    return answer(_connected(e2b, located, row), status=201)


# --- helpers -------------------------------------------------------------------------


def _filters(
    e2b: E2bService,
    state: str | None,
    metadata: str | None,
    template: str | None,
    started_after: str | None,
) -> Filters:
    return Filters(
        states=parse_states(state),
        metadata=tuple(parse_metadata_filter(metadata or "").items()),
        templates=_templates(e2b, template),
        started_after=parse_time("startedAfter", started_after),
    )


def _templates(e2b: E2bService, text: str | None) -> frozenset[str] | None:
    """The templates a ``template`` filter names: an alias, and what it stands for."""
    if not text:
        return None
    return frozenset({text, e2b.template_of(text)})


async def _listing(
    e2b: E2bService,
    namespace: str,
    filters: Filters,
    cursor: object,
    limit: int | None,
    descending: bool,
) -> Response:
    found, following, now = await e2b.call(
        e2b.store.page, namespace, sort_key, filters.accepts, cursor, descending, limit
    )
    items = [listed_body(e2b.config, located, now) for located in found]
    headers = {"X-Next-Token": encode_cursor(following)} if following is not None else None
    return Response(encode_listing(items), headers=headers, media_type=JSON)


def _connected(e2b: E2bService, located: Located, row: SandboxRow) -> Sandbox:
    network = row.network or None
    return sandbox_body(
        e2b.config,
        claim_id=located.entry.id,
        node=located.node,
        template=row.key.template,
        claim_token=row.token or "",
        private=network is not None and not network.public_traffic,
    )

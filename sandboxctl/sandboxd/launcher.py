"""Starting one sandbox, and cleaning one up: its runtime, its network attachment, its
template's start and ready commands, its row on disk and its events. Which sandboxes
exist, and who holds them, is the agent's (``agent.py``).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from sandboxctl.core.model import DEFAULT_NET, PoolKey
from sandboxctl.sandboxd.attachments import Attachments
from sandboxctl.sandboxd.errors import UnknownTemplate
from sandboxctl.sandboxd.events import EventLog
from sandboxctl.sandboxd.homes import Homes
from sandboxctl.sandboxd.runtime import SIZE_LIMITS, Identity, Runtime, SandboxSpec, Size
from sandboxctl.sandboxd.state import SandboxRecord, StateStore
from sandboxctl.sandboxd.templates.catalog import Catalog, Served
from sandboxctl.sandboxd.templates.startup import start_template
from sandboxctl.sandboxd.uids import SandboxUids


def identity(record: SandboxRecord) -> Identity:
    return Identity(record.pid, record.start_time, record.pid_namespace)


class Launcher:
    """Thread-safe: each call works on one sandbox, its parts lock what they share."""

    def __init__(
        self,
        runtime: Runtime,
        templates: Catalog,
        homes: Homes,
        attachments: Attachments,
        uids: SandboxUids,
        state: StateStore,
        events: EventLog,
        now: Callable[[], float],
        ready_timeout: float,
    ) -> None:
        self.runtime = runtime
        self._templates = templates
        self._homes = homes
        self._attachments = attachments
        self._uids = uids
        self._state = state
        self._events = events
        self._now = now
        self._ready_timeout = ready_timeout

    def spec(self, record: SandboxRecord) -> SandboxSpec:
        return SandboxSpec(
            id=record.id,
            uid=record.uid,
            root=self._templates.get(record.template, Path("/")),
            home=self._homes.path(record.id),
            limits=SIZE_LIMITS[Size(record.size)],
            hostname=record.id.replace("_", "-"),
            address=record.address,
            env=record.env,
            resolv_conf=self._attachments.resolv_conf,
        )

    def start(self, key: PoolKey, uid: int) -> SandboxRecord:
        """Start an unclaimed sandbox of ``key`` as ``uid`` (reserved by the caller, who
        releases it when this raises) and persist it."""
        address = self._attachments.take_address()
        record = _unclaimed(key, uid, address, self._now())
        try:
            template = self._templates.served(key.template)
            if template is None:  # removed from the store since the claim was checked
                raise UnknownTemplate(f"template {key.template!r} is not served by this node")
            spec = replace(self.spec(record), root=template.root)
            started = self.runtime.start(spec)
            try:
                self._attachments.attach(record, pid=started.pid)
            except BaseException:
                self.runtime.destroy(self.spec(record), started)
                raise
            if template.start_cmd or template.ready_cmd:
                self._start_template(record, spec, started, template)
        except BaseException:
            self._attachments.free_address(address)
            raise
        record.pid = started.pid
        record.start_time = started.start_time
        record.pid_namespace = started.pid_namespace
        self._state.put(record)
        self._events.record(record.id, "sandbox created", template=key.template)
        return record

    def cleanup(self, record: SandboxRecord, running: Identity | None) -> None:
        """Destroy a sandbox the agent has forgotten (``running`` None: it may be dead)."""
        # Kill first, forget on disk second: a crash in between leaves a row whose
        # sandbox is dead, which the next start cleans up. A failed destroy keeps the row
        # and the uid, so the sandbox is retried at the next start instead of leaking.
        self.runtime.destroy(self.spec(record), running)
        self._attachments.detach(record)
        self._state.delete(record.id)
        self._events.gone(record.id)
        self._homes.ended(record.id)
        self._uids.release(record.uid)
        self._attachments.free_address(record.address)

    def _start_template(
        self, record: SandboxRecord, spec: SandboxSpec, started: Identity, template: Served
    ) -> None:
        """Its start command, then wait for its ready command; a sandbox that never gets
        ready is destroyed (RuntimeFailure: the claim's 503, the refill's retry)."""
        try:
            start_template(self.runtime, spec, started, template, self._events, self._ready_timeout)
        except BaseException:
            self._attachments.detach(record)
            self.runtime.destroy(spec, started)
            self._events.gone(record.id)
            raise


def _unclaimed(key: PoolKey, uid: int, address: str, now: float) -> SandboxRecord:
    return SandboxRecord(
        id="sb_" + secrets.token_hex(6),
        token="",
        template=key.template,
        net=DEFAULT_NET,
        size=key.size,
        uid=uid,
        pid=0,
        start_time=0,
        pid_namespace=0,
        claimed=False,
        claim_ref="",
        metadata={},
        ttl_seconds=0,
        deadline=None,
        claimed_at=None,
        on_expire="destroy",
        hibernated=False,
        created_at=now,
        address=address,
    )

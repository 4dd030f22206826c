"""Leases: what a claim may ask for, and the reaper that ends each lease at its deadline.

A claimed sandbox is held until its deadline (claim time plus its ttl, moved on by each
renew); then it is destroyed, or paused when its ``on_expire`` says so.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from datetime import timedelta

from sandboxctl.agentapi.models import ClaimRequest
from sandboxctl.core.envvars import check_env
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.ids import public_id
from sandboxctl.lifecycle import Loop, Stop
from sandboxctl.sandboxd.errors import BadRequest, Conflict, NoSuchSandbox
from sandboxctl.sandboxd.events import EventLog
from sandboxctl.sandboxd.state import SandboxRecord

log = logging.getLogger("sandboxctl.sandboxd")

ON_EXPIRE = ("destroy", "pause")
DEFAULT_TTL_SECONDS = 300
MAX_TTL_SECONDS = 24 * 3600
MAX_METADATA_PAIRS = 16
MAX_METADATA_BYTES = 4096


def lease_ttl(ttl_seconds: int) -> int:
    """The lease a ttl asks for: at most a day; 0 for the default."""
    return _clamped_ttl(ttl_seconds) or DEFAULT_TTL_SECONDS


def check_on_expire(on_expire: str) -> None:
    if on_expire not in ON_EXPIRE:
        raise BadRequest(f"on_expire: must be one of {', '.join(ON_EXPIRE)}")


def check_claim_terms(request: ClaimRequest) -> None:
    """A claim's ttl, on_expire, metadata, claim_ref and env (its pool key aside)."""
    _clamped_ttl(request.ttl_seconds)
    check_on_expire(request.on_expire)
    if len(request.metadata) > MAX_METADATA_PAIRS:
        raise BadRequest(f"metadata: at most {MAX_METADATA_PAIRS} pairs")
    encoded = sum(len(k.encode()) + len(v.encode()) for k, v in request.metadata.items())
    if encoded > MAX_METADATA_BYTES:
        raise BadRequest(f"metadata: at most {MAX_METADATA_BYTES} bytes")
    namespace, slash, name = request.claim_ref.partition("/")
    if request.claim_ref and (not slash or not namespace or not name or "/" in name):
        raise BadRequest("claim_ref: expected <namespace>/<name>")
    _check_env(request.env or {})


def is_due(record: SandboxRecord, now: float) -> bool:
    return record.claimed and record.deadline is not None and record.deadline <= now


class Reaper:
    """Ends the leases past their deadline: ``due(now)`` lists them, ``pause`` and
    ``destroy`` end one (Conflict or NoSuchSandbox from ``pause``: someone was first;
    ``destroy`` False: likewise)."""

    def __init__(
        self,
        due: Callable[[float], list[SandboxRecord]],
        pause: Callable[[str], None],
        destroy: Callable[[str], bool],
        events: EventLog,
        now: Callable[[], float],
        interval: float,
    ) -> None:
        self._due = due
        self._pause = pause
        self._destroy = destroy
        self._events = events
        self._now = now
        self._interval = interval

    def reap(self) -> list[tuple[str, str]]:
        """Act on every lease past its deadline; returns (id, "destroyed"|"paused")."""
        done: list[tuple[str, str]] = []
        for record in self._due(self._now()):
            if record.on_expire == "pause":
                if not record.hibernated:
                    with contextlib.suppress(Conflict, NoSuchSandbox):
                        self._pause(record.id)
                        done.append((record.id, "paused"))
            elif self._destroy(record.id):
                done.append((record.id, "destroyed"))
        for sandbox_id, action in done:
            log.info("sandbox %s expired: %s", public_id(sandbox_id), action)
            self._events.record(sandbox_id, f"sandbox timed out: {action}", action=action)
        return done

    def run(self, stopping: Stop) -> None:
        """The reaper loop: reap every ``interval`` until ``stopping``."""
        reap = Loop("lease reaper", self.reap, timedelta(seconds=self._interval),
                    immediately=False, logger=log)  # fmt: skip
        reap.run(stopping)


def _clamped_ttl(ttl_seconds: int) -> int:
    if ttl_seconds < 0:
        raise BadRequest("ttl_seconds: must not be negative")
    return min(ttl_seconds, MAX_TTL_SECONDS)


def _check_env(env: Mapping[str, str]) -> None:
    try:
        check_env(env)
    except InvalidValueError as error:
        raise BadRequest(str(error)) from None

"""Adoption: a conditional relabel of a worker pod's owner label.

The pod is read, then merge-patched with the resourceVersion it was read at, so the
server refuses the write (409) if anything changed in between. On 409 the pod is read
again and the decision is made again: if its owner is no longer the one first seen (a
newer owner took it meanwhile), adoption gives up rather than overwrite it. So a delayed
relabel from an earlier owner can never overwrite a newer one. A Terminating pod is never
adopted: new work must not go to a pod that is shutting down. Only the owner label
changes; every other label (worker id, version) stays as it was.
"""

from __future__ import annotations

import enum
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from sandboxctl.kube.corekinds import PodCalls
from sandboxctl.kube.errors import KubeConflict, KubeNotFound

DEFAULT_RETRIES = 3


class RefusedReason(enum.StrEnum):
    TERMINATING = "terminating"
    OWNED_BY_ANOTHER = "owned-by-another"
    NOT_FOUND = "not-found"
    CONFLICTS = "conflicts"  # every try met a newer version


@dataclass(frozen=True, slots=True)
class Adopted:
    resource_version: str
    previous: str | None


@dataclass(frozen=True, slots=True)
class AlreadyOwned:
    pass


@dataclass(frozen=True, slots=True)
class Refused:
    reason: RefusedReason
    owner: str | None = None  # the owner found, for OWNED_BY_ANOTHER


AdoptOutcome: TypeAlias = Adopted | AlreadyOwned | Refused


def adopt(
    calls: PodCalls,
    namespace: str,
    name: str,
    owner_label: str,
    owner: str,
    *,
    expected: str | None = None,
    timeout: float = 10.0,
    retries: int = DEFAULT_RETRIES,
    jitter: Callable[[], float] = random.random,
) -> AdoptOutcome:
    """Relabel ``namespace/name`` to ``owner_label=owner``. ``expected`` is the owner it
    is taken from (None: whoever owns it at the first read; an unlabelled pod is "")."""
    for attempt in range(1, retries + 1):
        try:
            pod = calls.get(namespace, name, timeout)
        except KubeNotFound:
            return Refused(RefusedReason.NOT_FOUND)
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return Refused(RefusedReason.TERMINATING)
        current = str((meta.get("labels") or {}).get(owner_label) or "")
        if current == owner:
            return AlreadyOwned()
        if expected is None:
            expected = current
        if current != expected:
            return Refused(RefusedReason.OWNED_BY_ANOTHER, current or None)
        body = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "labels": {owner_label: owner},
            }
        }
        try:
            patched = calls.patch(namespace, name, body, timeout)
        except KubeNotFound:
            return Refused(RefusedReason.NOT_FOUND)
        except KubeConflict:
            threading.Event().wait(0.02 * attempt * (1 + jitter()))
            continue
        version = str((patched.get("metadata") or {}).get("resourceVersion") or "")
        return Adopted(version, current or None)
    return Refused(RefusedReason.CONFLICTS)

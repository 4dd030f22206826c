"""``guard-workers clear``: remove every annotation this guard manages (an uninstall).

The pods are those the guard's selector (and owner label) chooses; the annotation is
removed where it is exactly ``"true"`` (another value is not the guard's). Terminating
pods are skipped: Karpenter ignores the annotation on them. Stop the guard first,
or it stamps busy pods again at its next tick.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandboxctl.guard.decide import Op, merge_patch
from sandboxctl.guard.pods import Override, pod_view
from sandboxctl.guard.settings import GuardSettings
from sandboxctl.kube.errors import KubeError, KubeNotFound


class ClearResult(enum.StrEnum):
    CLEARED = "cleared"
    WOULD_CLEAR = "would-clear"  # --dry-run
    GONE = "gone"
    FAILED = "failed"
    SKIPPED_TERMINATING = "skipped-terminating"


@dataclass(frozen=True, slots=True)
class Cleared:
    namespace: str
    name: str
    uid: str
    result: ClearResult
    pinned: bool = False
    error: str = ""


def clear_annotations(
    settings: GuardSettings,
    list_pods: Callable[[], list[dict[str, Any]]],
    patch: Callable[[str, str, dict[str, Any]], object],
    dry_run: bool = False,
) -> list[Cleared]:
    out = []
    for obj in list_pods():
        pod = pod_view(obj, settings.shape)
        if not pod.annotated:
            continue
        result, error = ClearResult.CLEARED, ""
        if pod.terminating:
            result = ClearResult.SKIPPED_TERMINATING
        elif dry_run:
            result = ClearResult.WOULD_CLEAR
        else:
            try:
                patch(pod.namespace, pod.name, merge_patch(settings.annotation, Op.CLEAR, pod.uid))
            except KubeNotFound:
                result = ClearResult.GONE
            except KubeError as failure:
                result, error = ClearResult.FAILED, str(failure)
        pinned = pod.override is Override.PIN
        out.append(Cleared(pod.namespace, pod.name, pod.uid, result, pinned, error))
    return out

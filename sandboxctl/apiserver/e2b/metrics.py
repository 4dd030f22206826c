"""e2b's sandbox metrics: the query parameters and the ``SandboxMetric`` body of one
usage sample (the owning agent samples; see sandboxd's ``usage.py``)."""

from __future__ import annotations

from typing import Any, Final

from sandboxctl.agentapi import UsageSample
from sandboxctl.apiserver.e2b.paging import BadQuery
from sandboxctl.core.timestamps import format_unix_millis

MAX_SANDBOX_IDS: Final = 100


def metric_body(sample: UsageSample) -> dict[str, Any]:
    """One ``SandboxMetric``."""
    return {
        "timestamp": format_unix_millis(sample.timestamp),
        "timestampUnix": int(sample.timestamp),
        "cpuCount": sample.cpu_count,
        "cpuUsedPct": sample.cpu_used_pct,
        "memUsed": sample.mem_used,
        "memTotal": sample.mem_total,
        "memCache": sample.mem_cache,
        "diskUsed": sample.disk_used,
        "diskTotal": sample.disk_total,
    }


def parse_seconds(name: str, text: str | None) -> int | None:
    """``start`` or ``end``: unix seconds, a whole number from 0 up."""
    if text is None or text == "":
        return None
    if not text.isascii() or not text.isdigit():
        raise BadQuery(f"{name} {text!r}: expected unix seconds, a whole number")
    return int(text)


def parse_sandbox_ids(text: str | None) -> list[str]:
    """``sandbox_ids``: required, comma-separated, at most 100, each once."""
    ids = [part.strip() for part in (text or "").split(",") if part.strip()]
    if not ids:
        raise BadQuery("sandbox_ids: required, a comma-separated list of sandbox ids")
    if len(ids) > MAX_SANDBOX_IDS:
        raise BadQuery(f"sandbox_ids: at most {MAX_SANDBOX_IDS} ids")
    if len(set(ids)) != len(ids):
        raise BadQuery("sandbox_ids: each id at most once")
    return ids

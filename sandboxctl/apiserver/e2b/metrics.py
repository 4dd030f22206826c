"""e2b's sandbox metrics: the query parameters and the ``SandboxMetric`` body of one
usage sample (the owning agent samples; see sandboxd's ``usage.py``)."""

from __future__ import annotations

from typing import Final

from sandboxctl.agentapi import UsageSample
from sandboxctl.apiserver.e2b.paging import BadQuery
from sandboxctl.core.timestamps import format_unix_millis
from sandboxctl.core.wire import Model

MAX_SANDBOX_IDS: Final = 100


class SandboxMetric(Model, frozen=True):
    """One ``SandboxMetric``: ``timestamp`` with milliseconds, ``timestampUnix`` whole."""

    timestamp: str
    timestampUnix: int
    cpuCount: int
    cpuUsedPct: float
    memUsed: int
    memTotal: int
    memCache: int
    diskUsed: int
    diskTotal: int

    @classmethod
    def of(cls, sample: UsageSample) -> SandboxMetric:
        return cls(
            format_unix_millis(sample.timestamp),
            int(sample.timestamp),
            sample.cpu_count,
            sample.cpu_used_pct,
            sample.mem_used,
            sample.mem_total,
            sample.mem_cache,
            sample.disk_used,
            sample.disk_total,
        )


class SandboxesWithMetrics(Model, frozen=True):
    """``GET /sandboxes/metrics``: the newest sample of each sandbox, by sandbox id."""

    sandboxes: dict[str, SandboxMetric]


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

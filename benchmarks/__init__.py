"""sandboxctl benchmarks: ``python -m benchmarks [NAME ...] [--json]``.

Every benchmark is a module ``benchmarks/bench_<name>.py`` with a ``run()`` function that
returns (or yields) rows, and one line in :data:`BENCHMARKS` below. A row is a flat dict
with at least ``benchmark`` and ``case``; figures carry their unit in their name
(``p50_us``, ``p99_ms``, ``rss_mb``, ``ratio``, ``ops``...). A row may say what it aims
for in ``target`` (text) and whether it got there in ``met`` (bool); a benchmark never
fails on a timing, it only reports.

Files are named ``bench_*.py`` so pytest never collects them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any

Row = dict[str, Any]
Benchmark = Callable[[], Iterable[Row]]

# name -> (module holding ``run()``, one-line description). Add new benchmarks here.
BENCHMARKS: dict[str, tuple[str, str]] = {
    "snapshot": (
        "benchmarks.bench_snapshot",
        "FleetSnapshot build/replace and FleetView reads",
    ),
    "sandboxd": ("benchmarks.bench_sandboxd", "host agent claim/release over HTTP, memory, starts"),
    "store": (
        "benchmarks.bench_store",
        "store lists, watch tick, lookups, pages and event log at 200x2000, old build beside",
    ),
    "e2b": ("benchmarks.bench_e2b", "e2b API: SDK create p50/p99, SDK list 1000, page at 200x2000"),
    "reads": (
        "benchmarks.bench_reads",
        "real agents: create then e2b list visible, watch event after a create",
    ),
    "envd": ("benchmarks.bench_envd", "envd proxy: added latency, throughput, upload RSS"),
    "apiserver": ("benchmarks.bench_apiserver", "Sandbox API: the token check per request"),
    "network": (
        "benchmarks.bench_network",
        "sandbox network: claim with policy, starts with/without, NAT throughput, get_host",
    ),
    "sampling": ("benchmarks.bench_sampling", "host agent: CPU time per sandbox usage sample"),
    "kube": (
        "benchmarks.bench_kube",
        "Kubernetes: informer event to snapshot, publish tick, dead-node leave, apiserver RSS",
    ),
    "controlplane": (
        "benchmarks.bench_controlplane",
        "the real control plane's start to ready: etcd and kube-apiserver, then the whole plane",
    ),
    "guard": (
        "benchmarks.bench_guard",
        "guard-workers: tick over 5000 pods, busy -> annotated, API requests per tick",
    ),
    "tenancy": (
        "benchmarks.bench_tenancy",
        "tenancy: claim/commands/files beside the build before, agent RSS under an unread flood",
    ),
    "capacity": (
        "benchmarks.bench_capacity",
        "e2b creates: 20 at once on 2 warm (failures, p50/p99), warm vs cold fallback",
    ),
    "templates": (
        "benchmarks.bench_templates",
        "templates: default template build (fresh, cached), size, cold start vs base",
    ),
    "first_port": (
        "benchmarks.bench_first_port",
        "guest port: python3 -m http.server in a fresh sandbox, start to first 200 via get_host",
    ),
    "guest_framing": (
        "benchmarks.bench_guest_framing",
        "guest port: a 10 MiB answer ended by the close, on each path, byte-exact",
    ),
    "metrics": (
        "benchmarks.bench_metrics",
        "request latency histograms: process CPU per warm SDK create on vs off, per request",
    ),
    "status": (
        "benchmarks.bench_status",
        "sandboxctl status on a one-node serve: the process (cold start) and the collection",
    ),
}


def with_target(row: Row, met: bool, target: str) -> Row:
    """Say what a row aims for and whether it got there; a benchmark never fails on it."""
    row["target"] = target
    row["met"] = met
    return row


def load(name: str) -> Benchmark:
    """The ``run`` function of one registered benchmark (imported on demand)."""
    module_name, _ = BENCHMARKS[name]
    run: Benchmark = importlib.import_module(module_name).run
    return run

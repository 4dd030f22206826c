"""What ``sandboxctl status`` shows about a fleet, as plain values: the nodes one read
gave, judged by the freshness rule at the reader's clock, their pools, sandboxes and
templates, and the endpoints the reader tried. Pure: the read is the caller's."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sandboxctl.core.freshness import FreshnessRule, NodeState
from sandboxctl.core.model import NodeInventory, PoolKey
from sandboxctl.core.names import REPORTS_API_VERSION
from sandboxctl.core.report import count_states, node_rows
from sandboxctl.core.snapshot import FleetSnapshot
from sandboxctl.core.timestamps import format_rfc3339

KIND = "FleetStatus"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One address of the fleet and whether it answered the reader (``problem`` says
    why not, in one line)."""

    name: str
    url: str
    problem: str = ""

    @property
    def up(self) -> bool:
        return not self.problem


@dataclass(frozen=True, slots=True)
class Unreached:
    """An agent asked for its inventory that gave none, and why."""

    address: str
    reason: str


@dataclass(frozen=True, slots=True)
class NodeStatus:
    node: str
    address: str
    state: NodeState
    published_at: datetime | None
    age: timedelta | None  # behind the reference; negative when ahead
    sandboxes: int
    capacity: int | None  # most claims at once; None when the node does not say


@dataclass(frozen=True, slots=True)
class PoolStatus:
    node: str
    key: PoolKey
    warm: int
    target: int


@dataclass(frozen=True, slots=True)
class TemplateStatus:
    """One template and the nodes that serve it; ``digest`` and ``size_bytes`` are its
    build's when it was built from packages (the newest build a node lists)."""

    name: str
    nodes: tuple[str, ...]
    digest: str = ""
    size_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class FleetStatus:
    source: str  # where the read came from, for people
    now: datetime
    rule: FreshnessRule
    nodes: tuple[NodeStatus, ...]
    pools: tuple[PoolStatus, ...]
    sandboxes: Mapping[str, int]  # phase -> sandboxes in it, on every node listed
    templates: tuple[TemplateStatus, ...]
    endpoints: tuple[Endpoint, ...] = ()
    unreached: tuple[Unreached, ...] = ()
    counts: Mapping[str, int] = field(default_factory=dict)  # node state -> nodes


def fleet_status(
    inventories: Iterable[NodeInventory],
    rule: FreshnessRule,
    now: datetime,
    source: str,
    endpoints: Iterable[Endpoint] = (),
    unreached: Iterable[Unreached] = (),
) -> FleetStatus:
    """The status of the nodes one read gave, judged at ``now``. A one-shot read sees
    every stamp for the first time now, so it has no stall credit and no extrapolation
    (as ``sandboxctl inventory``)."""
    snapshot = FleetSnapshot.build(list(inventories), seen_at=0.0)
    view = snapshot.view(rule, now, monotonic=0.0)
    rows = node_rows(view)
    nodes: list[NodeStatus] = []
    pools: list[PoolStatus] = []
    phases: Counter[str] = Counter()
    served: dict[str, list[str]] = {}
    builds: dict[str, Mapping[str, Any]] = {}
    for row in rows:
        record = snapshot.record(row.node)
        assert record is not None  # every row is a listed node
        inventory = record.inventory
        nodes.append(
            NodeStatus(
                row.node,
                row.address,
                row.state,
                row.published_at,
                row.age,
                row.sandboxes,
                inventory.capacity,
            )
        )
        pools.extend(PoolStatus(row.node, p.key, p.warm, p.target) for p in inventory.pools)
        phases.update(entry.phase for entry in inventory.entries)
        for template in inventory.templates:
            name = str(template.get("template") or "")
            if not name:
                continue
            served.setdefault(name, []).append(row.node)
            if template.get("digest") and name not in builds:  # the first build listed
                builds[name] = template
    templates = tuple(
        TemplateStatus(
            name,
            tuple(served[name]),
            str(builds.get(name, {}).get("digest") or ""),
            _count(builds.get(name, {}).get("sizeBytes")),
        )
        for name in sorted(served)
    )
    return FleetStatus(
        source=source,
        now=now,
        rule=rule,
        nodes=tuple(nodes),
        pools=tuple(pools),
        sandboxes=dict(sorted(phases.items())),
        templates=templates,
        endpoints=tuple(endpoints),
        unreached=tuple(unreached),
        counts=count_states(rows),
    )


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def status_document(status: FleetStatus) -> dict[str, Any]:
    """The stable JSON document of ``status -o json`` (docs/cli.md); fields are only
    ever added."""
    rule = status.rule
    return {
        "apiVersion": REPORTS_API_VERSION,
        "kind": KIND,
        "now": format_rfc3339(status.now),
        "source": status.source,
        "rule": {
            "staleAfterSeconds": rule.stale_after.total_seconds(),
            "reference": rule.mode.value,
            "publishIntervalSeconds": rule.publish_interval.total_seconds(),
        },
        "endpoints": [
            {"name": e.name, "url": e.url, "up": e.up, "problem": e.problem}
            for e in status.endpoints
        ],
        "counts": dict(status.counts),
        "nodes": [
            {
                "node": n.node,
                "address": n.address,
                "state": n.state.value,
                "publishedAt": format_rfc3339(n.published_at) if n.published_at else None,
                "ageSeconds": n.age.total_seconds() if n.age is not None else None,
                "sandboxes": n.sandboxes,
                "capacity": n.capacity,
            }
            for n in status.nodes
        ],
        "unreachable": [{"address": u.address, "reason": u.reason} for u in status.unreached],
        "pools": [
            {
                "node": p.node,
                "template": p.key.template,
                "net": p.key.net,
                "size": p.key.size,
                "warm": p.warm,
                "target": p.target,
            }
            for p in status.pools
        ],
        "sandboxes": {"total": sum(status.sandboxes.values()), "byState": dict(status.sandboxes)},
        "templates": [
            {
                "template": t.name,
                "nodes": list(t.nodes),
                "digest": t.digest,
                "sizeBytes": t.size_bytes,
            }
            for t in status.templates
        ],
    }

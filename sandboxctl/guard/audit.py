"""The NodePool audit (``guard-workers audit-nodepools``): is the guard's protection
bounded, and how long can a roll take? Pure: the NodePools, NodeClaims, Nodes and worker
pods go in (read by ``karpenter``), findings come out.

``karpenter.sh/do-not-disrupt`` is bounded only by a NodePool's
``spec.template.spec.terminationGracePeriod`` (TGP): with it, drift and expiry drain a
busy node anyway once the grace runs out; without it, drift skips the node for as
long as the annotation stays and expiry leaves it half-drained forever.

| level | rule | when |
|---|---|---|
| FAIL | no-termination-grace-period | the guard is on and TGP is unset |
| WARN | grace-not-above-worker-grace | TGP <= the workers' terminationGracePeriodSeconds |
| WARN | grace-above-max-roll | TGP above ``--max-roll`` |
| WARN | expiry-with-annotations | expireAfter set, an annotated pod there, TGP unset |
| WARN | claims-without-ceiling | NodeClaims whose own TGP is unset or differs |
| WARN | nodepool-missing | a relevant NodePool does not exist |
| INFO | budgets, consolidation, worst-case-roll, disrupted-nodes, drifted-claims | always |

Worst-case roll time = ceil(busy nodes / effective Drifted budget) x TGP: once TGP
is set a busy drifted node holds its Drifted slot while it drains.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sandboxctl.core.durations import format_duration, parse_duration
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.guard.pods import NODEPOOL_LABEL, NodeView

DEFAULT_EXPIRE_AFTER = "720h"
DEFAULT_CONSOLIDATION = "WhenEmptyOrUnderutilized"
DEFAULT_BUDGET = "10%"
REASONS = ("Drifted", "Empty", "Underutilized")


class Level(enum.StrEnum):
    OK = "ok"
    INFO = "info"
    WARN = "warn"
    FAIL = "fail"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Level.OK: 0, Level.INFO: 0, Level.WARN: 1, Level.FAIL: 2}
EXIT_OK, EXIT_WARN, EXIT_FAIL = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Budget:
    nodes: str
    reasons: tuple[str, ...] = ()  # none: every reason
    schedule: str = ""
    duration: str = ""

    def allowed(self, total: int) -> int:
        """Nodes this budget lets go at once (before Karpenter subtracts the deleting and
        NotReady ones)."""
        text = self.nodes.strip()
        if text.endswith("%"):
            percent = _number(text[:-1], self.nodes)
            return math.ceil(total * percent / 100)
        return int(_number(text, self.nodes))

    def matches(self, reason: str) -> bool:
        return not self.reasons or reason in self.reasons


@dataclass(frozen=True, slots=True)
class NodePoolSpec:
    name: str
    termination_grace: timedelta | None
    expire_after: timedelta | None  # None: Never
    expire_after_text: str
    consolidation_policy: str
    consolidate_after: str
    budgets: tuple[Budget, ...]


@dataclass(frozen=True, slots=True)
class ClaimView:
    name: str
    nodepool: str
    termination_grace: timedelta | None
    drifted: bool


@dataclass(frozen=True, slots=True)
class Worker:
    """One guarded pod as the audit sees it."""

    name: str  # namespace/name
    node: str
    annotated: bool
    grace_seconds: int


@dataclass(frozen=True)
class AuditInput:
    nodepools: Mapping[str, NodePoolSpec]
    workers: Sequence[Worker] = ()
    nodes: Mapping[str, NodeView] = field(default_factory=dict)
    claims: Sequence[ClaimView] = ()
    configured: Sequence[str] = ()  # NodePools named by --nodepool
    guard_enabled: bool = True
    max_roll: timedelta | None = None
    nodepool_api: bool = True  # False: the cluster does not serve karpenter.sh NodePools


@dataclass(frozen=True, slots=True)
class Finding:
    level: Level
    nodepool: str
    rule: str
    message: str


@dataclass(frozen=True)
class PoolReport:
    name: str
    found: bool
    termination_grace: timedelta | None = None
    expire_after: str = ""
    consolidation_policy: str = ""
    consolidate_after: str = ""
    nodes: int = 0
    busy_nodes: int = 0
    workers: int = 0
    worker_grace_seconds: int | None = None
    budgets: Mapping[str, int] = field(default_factory=dict)
    scheduled_budgets: tuple[Budget, ...] = ()
    worst_case_roll: timedelta | None = None  # None: unbounded (or no TGP)
    claims: int = 0
    claims_without_ceiling: int = 0
    disrupted_nodes: tuple[str, ...] = ()
    drifted_claims: tuple[str, ...] = ()


@dataclass(frozen=True)
class AuditReport:
    pools: tuple[PoolReport, ...]
    findings: tuple[Finding, ...]
    guard_enabled: bool

    @property
    def verdict(self) -> Level:
        worst = max((f.level.rank for f in self.findings), default=0)
        return {0: Level.OK, 1: Level.WARN, 2: Level.FAIL}[worst]

    def exit_code(self, fail_on: Level = Level.FAIL) -> int:
        verdict = self.verdict
        if verdict is Level.FAIL:
            return EXIT_FAIL
        if verdict is Level.WARN:
            return EXIT_FAIL if fail_on is Level.WARN else EXIT_WARN
        return EXIT_OK

    def failures(self) -> list[Finding]:
        return [f for f in self.findings if f.level is Level.FAIL]


# --- reading the objects ------------------------------------------------------------------


def nodepool_spec(obj: Mapping[str, Any]) -> NodePoolSpec:
    """Read the fields the audit needs; InvalidValueError names the NodePool and field."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    spec = obj.get("spec") or {}
    template = (spec.get("template") or {}).get("spec") or {}
    disruption = spec.get("disruption") or {}
    where = f"NodePool {name}"
    grace = _duration(template.get("terminationGracePeriod"), f"{where}: terminationGracePeriod")
    expire_text = str(template.get("expireAfter") or DEFAULT_EXPIRE_AFTER)
    expire = (
        None
        if expire_text == "Never"
        else _duration(expire_text, f"{where}: spec.template.spec.expireAfter")
    )
    budgets = _budgets(disruption.get("budgets"))
    return NodePoolSpec(
        name=name,
        termination_grace=grace,
        expire_after=expire,
        expire_after_text=expire_text,
        consolidation_policy=str(disruption.get("consolidationPolicy") or DEFAULT_CONSOLIDATION),
        consolidate_after=str(disruption.get("consolidateAfter") or ""),
        budgets=budgets,
    )


def _budgets(raw: object) -> tuple[Budget, ...]:
    """``spec.disruption.budgets``, or Karpenter's default of 10 %; an unreadable count is
    refused now (InvalidValueError), not when the audit first uses it."""
    budgets = tuple(
        Budget(
            nodes=str(b.get("nodes", DEFAULT_BUDGET)),
            reasons=tuple(str(r) for r in b.get("reasons") or ()),
            schedule=str(b.get("schedule") or ""),
            duration=str(b.get("duration") or ""),
        )
        for b in (raw if isinstance(raw, list) else [])
        if isinstance(b, dict)
    ) or (Budget(DEFAULT_BUDGET),)
    for budget in budgets:
        budget.allowed(0)
    return budgets


def claim_view(obj: Mapping[str, Any]) -> ClaimView:
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    conditions = (obj.get("status") or {}).get("conditions") or []
    return ClaimView(
        name=name,
        nodepool=str((meta.get("labels") or {}).get(NODEPOOL_LABEL) or ""),
        termination_grace=_duration(
            (obj.get("spec") or {}).get("terminationGracePeriod"),
            f"NodeClaim {name}: spec.terminationGracePeriod",
        ),
        drifted=any(
            isinstance(c, dict) and c.get("type") == "Drifted" and c.get("status") == "True"
            for c in conditions
        ),
    )


def relevant_nodepools(
    workers: Iterable[Worker], nodes: Mapping[str, NodeView], configured: Iterable[str]
) -> list[str]:
    """The NodePools of the nodes the workers run on, and those named in configuration."""
    found = {nodes[w.node].nodepool for w in workers if w.node in nodes}
    found.discard("")
    return sorted(found | set(configured))


# --- the audit ----------------------------------------------------------------------------


def audit(given: AuditInput) -> AuditReport:
    findings: list[Finding] = []
    if not given.nodepool_api:
        level = Level.WARN if given.configured else Level.INFO
        findings.append(
            Finding(
                level,
                "",
                "no-karpenter",
                "the cluster serves no karpenter.sh/v1 NodePools: no Karpenter disruption to "
                "bound or block here",
            )
        )
        return AuditReport((), tuple(findings), given.guard_enabled)
    names = relevant_nodepools(given.workers, given.nodes, given.configured)
    if not names:
        findings.append(
            Finding(
                Level.INFO,
                "",
                "no-nodepools",
                "no guarded pod runs on a Karpenter node and no --nodepool is named: nothing "
                "to audit yet",
            )
        )
    pools = []
    for name in names:
        spec = given.nodepools.get(name)
        if spec is None:
            findings.append(
                Finding(Level.WARN, name, "nodepool-missing", f"NodePool {name} does not exist")
            )
            pools.append(PoolReport(name=name, found=False))
            continue
        report, found = _audit_pool(spec, given)
        pools.append(report)
        findings.extend(found)
    return AuditReport(tuple(pools), tuple(findings), given.guard_enabled)


@dataclass(frozen=True)
class _Pool:
    """One NodePool as the rules read it: its spec, and what of the cluster runs under it."""

    spec: NodePoolSpec
    given: AuditInput
    nodes: frozenset[str]
    workers: tuple[Worker, ...]
    claims: tuple[ClaimView, ...]

    @classmethod
    def of(cls, spec: NodePoolSpec, given: AuditInput) -> _Pool:
        nodes = frozenset(n for n, view in given.nodes.items() if view.nodepool == spec.name)
        return cls(
            spec,
            given,
            nodes,
            tuple(w for w in given.workers if w.node in nodes),
            tuple(c for c in given.claims if c.nodepool == spec.name),
        )

    @property
    def grace(self) -> timedelta | None:
        return self.spec.termination_grace

    @property
    def total(self) -> int:
        """Nodes the budgets count: its nodes, or its NodeClaims if more are being made."""
        return max(len(self.nodes), len(self.claims))

    @property
    def annotated(self) -> list[Worker]:
        return [w for w in self.workers if w.annotated]

    @property
    def busy_nodes(self) -> set[str]:
        return {w.node for w in self.annotated}

    @property
    def worker_grace(self) -> int | None:
        return max((w.grace_seconds for w in self.workers), default=None)

    @property
    def stale_claims(self) -> list[ClaimView]:
        """NodeClaims whose own grace is not the NodePool's (it is copied at creation)."""
        grace = self.grace
        return [c for c in self.claims if grace is not None and c.termination_grace != grace]

    def budgets(self) -> dict[str, int]:
        """Nodes each reason may disrupt at once under the unscheduled budgets."""
        always = [b for b in self.spec.budgets if not b.schedule]
        total = self.total
        return {
            reason: min((b.allowed(total) for b in always if b.matches(reason)), default=total)
            for reason in REASONS
        }

    @property
    def scheduled_budgets(self) -> tuple[Budget, ...]:
        return tuple(b for b in self.spec.budgets if b.schedule)


# --- the rules, in the order the report gives their findings: each a message or None -----


def _no_termination_grace_period(pool: _Pool) -> str | None:
    if pool.grace is not None or not pool.given.guard_enabled:
        return None
    return (
        "spec.template.spec.terminationGracePeriod is unset: a busy pod's "
        "do-not-disrupt blocks drift for as long as it stays and leaves an expired "
        "node half-drained forever; set it (e.g. 1h), let the NodeClaims cycle, "
        "then stamp"
    )


def _grace_not_above_worker_grace(pool: _Pool) -> str | None:
    tgp, worker_grace = pool.grace, pool.worker_grace
    if tgp is None or worker_grace is None or tgp > timedelta(seconds=worker_grace):
        return None
    return (
        f"terminationGracePeriod {format_duration(tgp)} is not above the workers' "
        f"terminationGracePeriodSeconds {worker_grace}: Karpenter deletes them as the "
        "drain starts and they lose their grace"
    )


def _grace_above_max_roll(pool: _Pool) -> str | None:
    tgp, max_roll = pool.grace, pool.given.max_roll
    if tgp is None or max_roll is None or tgp <= max_roll:
        return None
    return (
        f"terminationGracePeriod {format_duration(tgp)} is above --max-roll "
        f"{format_duration(max_roll)}: one busy node alone can hold a roll longer"
    )


def _expiry_with_annotations(pool: _Pool) -> str | None:
    annotated = pool.annotated
    if pool.spec.expire_after is None or pool.grace is not None or not annotated:
        return None
    return (
        f"expireAfter {pool.spec.expire_after_text} with {len(annotated)} annotated pod(s) "
        "and no terminationGracePeriod: an expired node stays half-drained while the "
        "annotation stays"
    )


def _claims_without_ceiling(pool: _Pool) -> str | None:
    stale = pool.stale_claims
    if not stale:
        return None
    return (
        f"{len(stale)} of {len(pool.claims)} NodeClaims carry no or another "
        "terminationGracePeriod than the NodePool: it is copied at creation; "
        "cycle them before relying on the ceiling"
    )


_RULES: tuple[tuple[Level, str, Callable[[_Pool], str | None]], ...] = (
    (Level.FAIL, "no-termination-grace-period", _no_termination_grace_period),
    (Level.WARN, "grace-not-above-worker-grace", _grace_not_above_worker_grace),
    (Level.WARN, "grace-above-max-roll", _grace_above_max_roll),
    (Level.WARN, "expiry-with-annotations", _expiry_with_annotations),
    (Level.WARN, "claims-without-ceiling", _claims_without_ceiling),
)


def _audit_pool(spec: NodePoolSpec, given: AuditInput) -> tuple[PoolReport, list[Finding]]:
    pool = _Pool.of(spec, given)
    found = [
        Finding(level, spec.name, rule, message)
        for level, rule, check in _RULES
        if (message := check(pool)) is not None
    ]
    budgets, busy = pool.budgets(), len(pool.busy_nodes)
    roll = _worst_case_roll(busy, budgets["Drifted"], pool.grace)
    disrupted = tuple(sorted(n for n in pool.nodes if given.nodes[n].disrupted))
    drifted = tuple(sorted(c.name for c in pool.claims if c.drifted))
    facts = [
        ("budgets", _budget_text(budgets, pool.scheduled_budgets, pool.total)),
        ("consolidation", _consolidation_text(spec)),
        ("worst-case-roll", _roll_text(busy, budgets["Drifted"], pool.grace, roll)),
    ]
    if disrupted:
        facts.append(("disrupted-nodes", "tainted karpenter.sh/disrupted: " + ", ".join(disrupted)))
    if drifted:
        facts.append(("drifted-claims", "NodeClaims with Drifted=True: " + ", ".join(drifted)))
    found += [Finding(Level.INFO, spec.name, rule, message) for rule, message in facts]
    report = PoolReport(
        name=spec.name,
        found=True,
        termination_grace=pool.grace,
        expire_after=spec.expire_after_text,
        consolidation_policy=spec.consolidation_policy,
        consolidate_after=spec.consolidate_after,
        nodes=pool.total,
        busy_nodes=busy,
        workers=len(pool.workers),
        worker_grace_seconds=pool.worker_grace,
        budgets=budgets,
        scheduled_budgets=pool.scheduled_budgets,
        worst_case_roll=roll,
        claims=len(pool.claims),
        claims_without_ceiling=len(pool.stale_claims),
        disrupted_nodes=disrupted,
        drifted_claims=drifted,
    )
    return report, found


def _worst_case_roll(busy: int, drift_budget: int, tgp: timedelta | None) -> timedelta | None:
    if busy == 0:
        return timedelta(0)
    if tgp is None or drift_budget <= 0:
        return None
    return math.ceil(busy / drift_budget) * tgp


def _roll_text(busy: int, budget: int, tgp: timedelta | None, roll: timedelta | None) -> str:
    head = f"{busy} busy node(s), Drifted budget {budget}"
    if roll is not None:
        return f"{head}: worst-case roll {format_duration(roll)}"
    if tgp is None:
        return f"{head}: worst-case roll unbounded (no terminationGracePeriod)"
    return f"{head}: drift never proceeds (a Drifted budget of 0)"


def _budget_text(budgets: Mapping[str, int], scheduled: Sequence[Budget], total: int) -> str:
    parts = [f"{reason} {budgets[reason]}" for reason in REASONS]
    text = f"nodes that may be disrupted at once, of {total}: " + ", ".join(parts)
    if scheduled:
        text += "; scheduled: " + ", ".join(
            f"{b.nodes} for {'/'.join(b.reasons) or 'all'} at '{b.schedule}' for {b.duration}"
            for b in scheduled
        )
    return text


def _consolidation_text(spec: NodePoolSpec) -> str:
    after = f" after {spec.consolidate_after}" if spec.consolidate_after else ""
    if spec.consolidation_policy == "WhenEmpty":
        return f"WhenEmpty{after}: any worker pod, busy or idle, keeps its node"
    return (
        f"{spec.consolidation_policy}{after}: the annotation is a busy worker's only "
        "protection from consolidation"
    )


def _duration(value: object, where: str) -> timedelta | None:
    if value is None or value == "":
        return None
    try:
        return parse_duration(str(value))
    except InvalidValueError as error:
        raise InvalidValueError(f"{where}: {error}") from None


def _number(text: str, original: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InvalidValueError(
            f"budget nodes {original!r}: expected a count or a percentage"
        ) from None
    if value < 0:
        raise InvalidValueError(f"budget nodes {original!r}: must not be negative")
    return value

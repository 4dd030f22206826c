"""The guard lanes G-01..G-05: ``guard-workers`` as processes against the kit's control
plane with Karpenter's NodePools in it (:mod:`sandboxctl.lanes.guardkit`), judged from
outside: the pods' annotation as the API server has it, the guards' ``/status`` and
``/metrics``, the CLI's exit codes. Every bound derives from :class:`GuardWindows`.

Each lane has its own pods (labelled with the lane) and its own guards. A lane's guards
are spawned while the lane before it runs (a guard's start is the slowest part) and each
lane stops its own when it ends, so a lane that fails leaves the
next one a clean start. "Within one tick" is judged in seconds (tick + delivery); G-01
also counts the guard's polls of the busy signal, which a loaded machine does not stretch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import httpx
from kubernetes.client.exceptions import ApiException

from sandboxctl.core.errors import SandboxctlError
from sandboxctl.core.timestamps import parse_rfc3339
from sandboxctl.guard.pods import ANNOTATION, DISRUPTED_TAINT
from sandboxctl.kube.resources import has_condition
from sandboxctl.lanes.guardkit import (
    OWNER_LABEL,
    TERMINATION_DEADLINE,
    Completed,
    Guard,
    GuardKit,
    GuardWindows,
    KarpenterKit,
    KarpenterWindows,
    LocalGuardKit,
    audit_document,
)
from sandboxctl.lanes.kit import Kit
from sandboxctl.lanes.model import LOCAL, Lane, LaneError, Progress, Verdict

GROUP = "G"
ONLY_LOCAL = frozenset({LOCAL})
BOUNDED_POOL = "lanes-bounded"  # terminationGracePeriod 1h: the guard may stamp
UNBOUNDED_POOL = "lanes-unbounded"  # no terminationGracePeriod: the audit must FAIL it
NODE = "lanes-node-1"
UNBOUNDED_NODE = "lanes-node-2"
STAMPED = "true"
PATIENCE = 4.0  # a lane waits this many times its bound, so a late change is measured
MAX_POLLS = 2  # "within one tick": the poll that saw the change may be the next one
GUARD_READY = 180.0  # seconds for a guard to sync (its start imports the Kubernetes client)

LANES = (
    Lane("G-01", GROUP, "a worker pod that turns busy carries karpenter.sh/do-not-disrupt "
         "within one guard tick; an idle one does not", ONLY_LOCAL),
    Lane("G-02", GROUP, "failover: when the guard owning busy workers is killed (their "
         "sessions die with it), the surviving guard that adopts them clears the orphaned "
         "protections within one tick and keeps its own", ONLY_LOCAL),
    Lane("G-03", GROUP, "a busy worker that turns Terminating and stops answering is "
         "deferred, not declared lost, until its deadline (deletionTimestamp + drain slack), "
         "then lost within one tick; the guard never patches or deletes it", ONLY_LOCAL),
    Lane("G-04", GROUP, "audit-nodepools FAILs a NodePool without terminationGracePeriod "
         "(exit 2) and passes a bounded one (exit 0); run refuses to stamp over the "
         "unbounded one in one line", ONLY_LOCAL),
    Lane("G-05", GROUP, "a person's edit of the protection is healed within one tick: "
         "removed from a busy pod, it comes back; added to an idle pod, it goes", ONLY_LOCAL),
)  # fmt: skip

OpenGuardKit = Callable[[Kit], AbstractContextManager[GuardKit]]
Judge = Callable[[GuardKit, Progress, list[Guard]], Verdict]


def local_guard_kit(kit: Kit) -> AbstractContextManager[GuardKit]:
    return LocalGuardKit.open(kit.kubeconfig)


def _seconds(value: float) -> str:
    return f"{value:.2f} s"


def _tick_bound(w: GuardWindows) -> str:
    return f"≤ {w.within_tick:g} s (1 tick {w.tick:g} s + {w.delivery:g} s delivery)"


# The guards each lane runs: (name, lane whose pods it guards, flags).
def _guards(lane: str, kit: GuardKit) -> list[tuple[str, str, list[str]]]:
    w = kit.windows
    owner = f"--owner-label={OWNER_LABEL}"
    return {
        "G-01": [("g01", "g01", [kit.busy_sessions("g01")])],
        "G-02": [
            ("g1", "g02", [kit.busy_sessions("g1"), f"{owner}=g1"]),
            ("g2", "g02", [kit.busy_sessions("g2"), f"{owner}=g2"]),
        ],
        "G-03": [
            (
                "g03",
                "g03",
                [
                    kit.busy_probes(),
                    f"--probe-fail-threshold={w.fail_threshold}",
                    f"--drain-slack={w.drain_slack:g}s",
                ],
            ),
        ],
        "G-04": [],  # its guard must refuse to start: run as a command
        "G-05": [("g05", "g05", [kit.busy_sessions("g05")])],
    }[lane]


class GuardScenario:
    lanes: tuple[Lane, ...] = LANES

    def __init__(self, open_kit: OpenGuardKit = local_guard_kit) -> None:
        self.open_kit = open_kit

    def run(self, kit: Kit, selected: frozenset[str], progress: Progress) -> Iterable[Verdict]:
        judges: dict[str, Judge] = {
            "G-01": busy_pod_protected,
            "G-02": failover_clears_orphans,
            "G-03": terminating_worker_deferred,
            "G-04": audit_fails_unbounded,
            "G-05": human_edit_healed,
        }
        with self.open_kit(kit) as guard_kit:
            chosen = [lane for lane in LANES if lane.id in selected]
            progress.note(
                f"guard lanes: Karpenter's NodePools in the control plane; "
                f"guards on a {guard_kit.windows.tick:g} s tick"
            )
            guard_kit.nodepool(BOUNDED_POOL, "1h")
            guard_kit.node(NODE, BOUNDED_POOL)
            guards: dict[str, list[Guard]] = {}
            for index, lane in enumerate(chosen):
                for upcoming in chosen[index : index + 2]:
                    if upcoming.id not in guards:
                        specs = _guards(upcoming.id, guard_kit)
                        guards[upcoming.id] = [guard_kit.spawn_guard(*spec) for spec in specs]
                yield judged(lane, guard_kit, progress, judges[lane.id], guards[lane.id])


def judged(
    lane: Lane, kit: GuardKit, progress: Progress, judge: Judge, guards: list[Guard]
) -> Verdict:
    """The lane's verdict; a wait that ran out or a part that failed is a FAIL naming it.
    The lane's guards stop when it ends, whatever happened."""
    try:
        return judge(kit, progress, guards)
    except (SandboxctlError, ApiException, httpx.HTTPError) as error:
        # A wait that ran out (LaneTimeout), a guard that did not start or died (its
        # /status unreachable), an API call refused: this lane fails, the next one runs.
        why = " ".join(str(error).split()) or type(error).__name__
        return Verdict(lane.id, False, "not reached", BOUNDS[lane.id](kit.windows), why)
    finally:
        for guard in guards:
            guard.stop()


def _ready(progress: Progress, guards: list[Guard]) -> None:
    progress.note(f"waiting for {', '.join(g.name for g in guards)} to sync")
    for guard in guards:
        guard.ready(GUARD_READY)


def _timed(progress: Progress, what: str, check: Callable[[], Any], bound: float) -> float:
    """Seconds until ``check`` holds, waiting up to PATIENCE × ``bound``."""
    started = time.monotonic()
    progress.wait_for(what, lambda: True if check() else None, bound * PATIENCE)
    return time.monotonic() - started


def _stamped_all(kit: GuardKit, progress: Progress, pods: Iterable[str]) -> None:
    names = list(pods)
    progress.wait_for(
        f"{', '.join(names)} stamped",
        lambda: all(kit.annotation(p) == STAMPED for p in names) or None,
        kit.windows.within_tick * PATIENCE,
    )


# --- G-01 ---------------------------------------------------------------------------------


def busy_pod_protected(kit: GuardKit, progress: Progress, guards: list[Guard]) -> Verdict:
    w = kit.windows
    busy, idle = "g01-w1", "g01-w2"
    for pod in (busy, idle):
        kit.pod(pod, "g01", NODE)
    _ready(progress, guards)
    polls = kit.polls("g01")
    kit.set_busy(busy, True)
    took = _timed(
        progress, f"{busy} stamped", lambda: kit.annotation(busy) == STAMPED, w.within_tick
    )
    polled = kit.polls("g01") - polls
    idle_value = kit.annotation(idle)
    in_time = took <= w.within_tick and polled <= MAX_POLLS
    passed = in_time and idle_value is None
    detail = "" if passed else (
        "stamped late" if not in_time else f"the idle pod carries {idle_value!r}"
    )  # fmt: skip
    return Verdict(
        "G-01",
        passed,
        f"stamped {_seconds(took)} after the worker turned busy, at the guard's "
        f"{polled} poll(s) since; idle pod unstamped: {idle_value is None}",
        BOUNDS["G-01"](w),
        detail,
    )


# --- G-02 ---------------------------------------------------------------------------------


def failover_clears_orphans(kit: GuardKit, progress: Progress, guards: list[Guard]) -> Verdict:
    w = kit.windows
    orphans, own = ["g02-w1", "g02-w2"], "g02-w3"
    for pod in orphans:
        kit.pod(pod, "g02", NODE, owner="g1")
    kit.pod(own, "g02", NODE, owner="g2")
    for pod in (*orphans, own):
        kit.set_busy(pod, True)
    _ready(progress, guards)
    leader, survivor = guards
    _stamped_all(kit, progress, (*orphans, own))
    progress.note("killing g1 (SIGKILL); its workers' sessions die with it")
    leader.kill()
    for pod in orphans:
        kit.set_busy(pod, False)
    if not all(kit.annotation(p) == STAMPED for p in orphans):
        raise LaneError("g1's protections went before anyone adopted its workers")
    progress.note("g2 adopts g1's workers (the conditional relabel of guard-workers adopt)")
    started = time.monotonic()
    adopted = kit.adopt(orphans, "g2", taken_from="g1")
    if adopted != len(orphans):
        raise LaneError(f"g2 adopted {adopted} of g1's {len(orphans)} workers")
    progress.wait_for(
        "g2 to clear g1's orphaned protections",
        lambda: all(kit.annotation(p) is None for p in orphans) or None,
        w.within_tick * PATIENCE,
    )
    took = time.monotonic() - started
    cleared = survivor.metric("sandboxctl_guard_orphans_cleared_total")
    kept = kit.annotation(own) == STAMPED
    in_time = took <= w.within_tick
    passed = in_time and cleared == len(orphans) and kept
    return Verdict(
        "G-02",
        passed,
        f"g2 cleared {cleared:g} orphaned protection(s) {_seconds(took)} after the adoption "
        f"began; its own busy worker kept: {kept}",
        BOUNDS["G-02"](w),
        "" if passed else (
            "cleared late" if not in_time
            else f"orphans_cleared_total {cleared:g} (want {len(orphans)}), own kept {kept}"
        ),
    )  # fmt: skip


# --- G-03 ---------------------------------------------------------------------------------


def _health(guard: Guard, pod: str, health: str) -> dict[str, Any] | None:
    for row in guard.status().get("pods") or []:
        if row.get("name") == pod and row.get("health") == health:
            return dict(row)
    return None


def terminating_worker_deferred(kit: GuardKit, progress: Progress, guards: list[Guard]) -> Verdict:
    w = kit.windows
    pod = "g03-w1"
    kit.pod(pod, "g03", NODE, held=True)
    kit.set_busy(pod, True)
    _ready(progress, guards)
    (guard,) = guards
    _stamped_all(kit, progress, [pod])
    progress.note(f"deleting {pod} (grace {w.worker_grace} s); it drains and stops answering")
    kit.delete_pod(pod, w.worker_grace)
    kit.set_unresponsive(pod)
    deleted = time.time()
    judged_within = (w.fail_threshold + 1) * w.tick + w.delivery
    row = progress.wait_for(
        f"{pod} deferred", lambda: _health(guard, pod, "deferred"), judged_within * PATIENCE
    )
    deferred_after = time.time() - deleted
    deadline = parse_rfc3339(row["deadline"]).timestamp()
    until = max(deadline - time.time(), 0.0) + w.within_tick
    lost = progress.wait_for(
        f"{pod} lost at its deadline", lambda: _health(guard, pod, "lost"), until * PATIENCE
    )
    late = time.time() - deadline  # read after the guard judged it: never before it did
    found = kit.get_pod(pod)
    annotations = (found or {}).get("metadata", {}).get("annotations") or {}
    untouched = found is not None and annotations.get(ANNOTATION) == STAMPED
    reason = lost.get("lostReason")
    passed = 0 <= late <= w.within_tick and reason == "drain-deadline-passed" and untouched
    problems = []
    if late < 0:
        problems.append(f"lost {_seconds(-late)} before its deadline")
    elif late > w.within_tick:
        problems.append("lost late")
    if reason != "drain-deadline-passed":
        problems.append(f"lost for {reason!r}")
    if not untouched:
        problems.append("the Terminating pod was patched or deleted")
    return Verdict(
        "G-03",
        passed,
        f"deferred {_seconds(deferred_after)} after the delete; lost {_seconds(late)} after "
        f"its deadline ({reason}); pod untouched: {untouched}",
        BOUNDS["G-03"](w),
        "; ".join(problems),
    )


# --- G-04 ---------------------------------------------------------------------------------


def _fail_rules(completed: Completed) -> list[str]:
    document = audit_document(completed) or {}
    return [
        f.get("rule", "")
        for f in document.get("findings") or []
        if f.get("level") == "FAIL" and f.get("nodePool") == UNBOUNDED_POOL
    ]


def audit_fails_unbounded(kit: GuardKit, progress: Progress, guards: list[Guard]) -> Verdict:
    pod = "g04-w1"
    kit.nodepool(UNBOUNDED_POOL, None)
    kit.node(UNBOUNDED_NODE, UNBOUNDED_POOL)
    kit.pod(pod, "g04", UNBOUNDED_NODE)
    kit.set_busy(pod, True)
    scope = (f"--namespace={kit.namespace}", f"--selector={kit.selector('g04')}")
    progress.note("audit-nodepools on both NodePools, and run over the unbounded one")
    with ThreadPoolExecutor(3) as pool:
        unbounded = pool.submit(kit.cli, "audit-nodepools", *scope, "-o", "json")
        bounded = pool.submit(
            kit.cli, "audit-nodepools", f"--nodepool={BOUNDED_POOL}", "-o", "json"
        )
        refused = pool.submit(
            kit.cli, "run", *scope, kit.busy_sessions("g04"), "--listen=127.0.0.1:0"
        )
    fail, ok, run = unbounded.result(), bounded.result(), refused.result()
    rules = _fail_rules(fail)
    errors = [line for line in run.stderr.splitlines() if line.startswith("sandboxctl:")]
    one_line = len(errors) == 1 and "refusing to stamp" in errors[0]
    one_line = one_line and "Traceback" not in run.stderr
    unstamped = kit.annotation(pod) is None
    passed = (
        fail.code == 2
        and "no-termination-grace-period" in rules
        and ok.code == 0
        and run.code == 2
        and one_line
        and unstamped
    )
    return Verdict(
        "G-04",
        passed,
        f"unbounded: exit {fail.code}, FAIL {','.join(rules) or 'none'}; bounded: exit "
        f"{ok.code}; run: exit {run.code}, {len(errors)} error line(s), busy pod unstamped: "
        f"{unstamped}",
        BOUNDS["G-04"](kit.windows),
        "" if passed else (errors[0] if errors else ok.stdout.strip()[-300:]),
    )


# --- G-05 ---------------------------------------------------------------------------------


def human_edit_healed(kit: GuardKit, progress: Progress, guards: list[Guard]) -> Verdict:
    w = kit.windows
    busy, idle = "g05-w1", "g05-w2"
    for pod in (busy, idle):
        kit.pod(pod, "g05", NODE)
    kit.set_busy(busy, True)
    _ready(progress, guards)
    _stamped_all(kit, progress, [busy])
    kit.human_edit(busy, None)
    restored = _timed(progress, f"{busy}'s protection restored",
                      lambda: kit.annotation(busy) == STAMPED, w.within_tick)  # fmt: skip
    kit.human_edit(idle, STAMPED)
    cleared = _timed(progress, f"{idle}'s protection cleared",
                     lambda: kit.annotation(idle) is None, w.within_tick)  # fmt: skip
    passed = max(restored, cleared) <= w.within_tick
    return Verdict(
        "G-05",
        passed,
        f"restored on the busy pod {_seconds(restored)} after a person removed it; cleared "
        f"from the idle pod {_seconds(cleared)} after a person added it",
        BOUNDS["G-05"](w),
        "" if passed else "healed late",
    )


BOUNDS: dict[str, Callable[[GuardWindows], str]] = {
    "G-01": lambda w: f"{_tick_bound(w)}, at the guard's first or second poll",
    "G-02": lambda w: f"{_tick_bound(w)} after the adoption; g2's own busy worker kept",
    "G-03": lambda w: (
        f"lost within [deadline, deadline + {w.within_tick:g} s]; deadline = deletionTimestamp "
        f"+ {w.drain_slack:g} s slack (grace {w.worker_grace} s); never patched"
    ),
    "G-04": lambda w: (
        "unbounded: exit 2 with FAIL no-termination-grace-period; bounded: "
        "exit 0; run: exit 2 in one line, nothing stamped"
    ),
    "G-05": lambda w: f"each {_tick_bound(w)}",
}

SCENARIO = GuardScenario()


# === Karpenter's own controllers: G-06..G-10 ===============================================
#
# These lanes need Karpenter running against the kit's control plane (its kwok provider, with
# kube-scheduler and kwok): the kit makes NodePools, Karpenter makes the nodes for pending
# placeholder pods, the workers go onto those nodes by name, the placeholders go, and then
# Karpenter's drift and consolidation act on what the guard stamped. Every figure is read
# from the API: NodeClaims, Nodes and pods as Karpenter left them.

DRIFT_POOL = "lanes-drift"  # no terminationGracePeriod: do-not-disrupt blocks drift
BOUNDED_DRIFT_POOL = "lanes-drift-bounded"  # terminationGracePeriod set: drift is bounded
CONSOLIDATE_POOL = "lanes-consolidate"  # WhenEmptyOrUnderutilized, at once

KARPENTER_LANES = (
    Lane("G-06", GROUP, "Drift of a NodePool without terminationGracePeriod: Karpenter "
         "removes the drifted idle nodes and leaves the busy worker's node (do-not-disrupt) "
         "untouched for the whole hold, though it marked it Drifted", ONLY_LOCAL),
    Lane("G-07", GROUP, "audit-nodepools reads the NodePool and NodeClaims Karpenter acts on: "
         "its counts and drifted claims are the API's, and it FAILs the unbounded pool",
         ONLY_LOCAL),
    Lane("G-08", GROUP, "once the worker is idle, the guard clears the protection after its "
         "idle grace and Karpenter then replaces the drifted node", ONLY_LOCAL),
    Lane("G-09", GROUP, "with terminationGracePeriod set, Drift drains the busy node at once "
         "(bounded, never blocked): Karpenter deletes the pod at the node's deadline minus "
         "the pod's grace and the hold ends within grace + slack", ONLY_LOCAL),
    Lane("G-10", GROUP, "consolidation removes the idle node and never the busy one for the "
         "whole hold; once the guard clears it, the busy node goes too", ONLY_LOCAL),
)  # fmt: skip

OpenKarpenterKit = Callable[[Kit], AbstractContextManager[KarpenterKit]]


@dataclass
class _Drift:
    """What G-06 leaves for G-07 and G-08: the busy node it held and its NodeClaim."""

    node: str = ""
    claim: str = ""


class _Untouched:
    """Watches one Karpenter node while a busy pod protects it: the first moment it was
    touched (its NodeClaim deleting or gone, the node tainted karpenter.sh/disrupted or
    gone), and when its NodeClaim was first seen Drifted."""

    def __init__(self, kit: KarpenterKit, nodepool: str, node: str) -> None:
        self.kit, self.nodepool, self.node = kit, nodepool, node
        self.touched: str | None = None
        self.drifted_at: float | None = None

    def look(self) -> None:
        if self.touched is not None:
            return
        claim = _claim_of(self.kit, self.nodepool, self.node)
        taints = self.kit.node_taints(self.node)
        if claim is None or taints is None:
            self.touched = "its NodeClaim or node is gone"
        elif claim["metadata"].get("deletionTimestamp"):
            self.touched = "its NodeClaim is being deleted"
        elif DISRUPTED_TAINT in taints:
            self.touched = f"it is tainted {DISRUPTED_TAINT}"
        elif self.drifted_at is None and has_condition(claim, "Drifted"):
            self.drifted_at = time.monotonic()

    def drifted(self) -> float | None:
        """When its NodeClaim was first seen Drifted (looking once more)."""
        self.look()
        return self.drifted_at


def _claim_of(kit: KarpenterKit, nodepool: str, node: str) -> dict[str, Any] | None:
    for claim in kit.nodeclaims(nodepool):
        if (claim.get("status") or {}).get("nodeName") == node:
            return claim
    return None


def _provision(kit: KarpenterKit, progress: Progress, nodepool: str, count: int) -> list[str]:
    """``count`` nodes Karpenter made (and initialized) for placeholders of ``nodepool``."""
    kit.place(nodepool, count)
    nodes: list[str] = progress.wait_for(
        f"Karpenter to make {count} node(s) of {nodepool}",
        lambda: _exactly(kit.initialized_nodes(nodepool), count),
        kit.karpenter.provision,
    )
    return nodes


def _exactly(nodes: list[str], count: int) -> list[str] | None:
    return nodes if len(nodes) == count else None


def _hold(progress: Progress, watch: _Untouched, seconds: float) -> float:
    """Watch the node for ``seconds`` (the hold is a span to observe, not a state to wait
    for); how long it stayed untouched."""
    started = time.monotonic()

    def over() -> bool | None:
        watch.look()
        return True if watch.touched or time.monotonic() - started >= seconds else None

    progress.wait_for(f"{watch.node} held for {seconds:g} s", over, seconds * PATIENCE)
    return time.monotonic() - started


def _stamped_before(kit: KarpenterKit, progress: Progress, guards: list[Guard], pod: str) -> None:
    kit.set_busy(pod, True)
    _ready(progress, guards)
    _stamped_all(kit, progress, [pod])


def _gone_claim(kit: KarpenterKit, nodepool: str, node: str) -> bool:
    claim = _claim_of(kit, nodepool, node)
    return claim is None or bool(claim["metadata"].get("deletionTimestamp"))


def _consolidation_bound(k: KarpenterWindows) -> float:
    """Karpenter validates a consolidation (15 s) before acting on it, between disruption
    passes: up to three passes (one to find it, one during the validation, one to act)."""
    return 3 * k.disruption_poll + k.consolidation_validation


def _timestamp(text: str) -> float:
    return parse_rfc3339(text).timestamp()


# --- G-06 ---------------------------------------------------------------------------------


def drift_holds_busy_node(
    kit: KarpenterKit, progress: Progress, guards: list[Guard], drift: _Drift
) -> Verdict:
    k = kit.karpenter
    busy_node, *idle_nodes = _provision(kit, progress, DRIFT_POOL, 3)
    kit.pod("g06-busy", "g06", busy_node)
    for index, node in enumerate(idle_nodes):
        kit.pod(f"g06-idle-{index}", "g06", node)
    _stamped_before(kit, progress, guards, "g06-busy")
    kit.unplace(DRIFT_POOL)
    watch = _Untouched(kit, DRIFT_POOL, busy_node)
    progress.note(f"drifting {DRIFT_POOL}: a change of its template's annotations")
    started = time.monotonic()
    kit.drift(DRIFT_POOL, "1")

    def idle_gone() -> bool | None:
        watch.look()
        return all(_gone_claim(kit, DRIFT_POOL, n) for n in idle_nodes) or None

    progress.wait_for("the drifted idle nodes to go", idle_gone, 2 * k.disruption_poll * PATIENCE)
    idle_after = time.monotonic() - started
    progress.wait_for(
        f"{busy_node}'s NodeClaim marked Drifted",
        lambda: watch.drifted() or watch.touched,
        k.disruption_poll * PATIENCE,
    )
    held = 0.0 if watch.touched else _hold(progress, watch, k.hold)
    kept = time.monotonic() - started
    claim = _claim_of(kit, DRIFT_POOL, busy_node)
    drift.node, drift.claim = busy_node, (claim or {}).get("metadata", {}).get("name", "")
    drifted_for = time.monotonic() - (watch.drifted_at or time.monotonic())
    in_time = idle_after <= 2 * k.disruption_poll
    passed = watch.touched is None and in_time and held >= k.hold
    detail = "" if passed else (
        f"the busy node was touched: {watch.touched}" if watch.touched
        else f"the idle nodes went {idle_after:.1f} s after the drift"
    )  # fmt: skip
    return Verdict(
        "G-06",
        passed,
        f"{len(idle_nodes)} idle node(s) gone {_seconds(idle_after)} after the drift; busy "
        f"node untouched {_seconds(kept)} after the drift, {_seconds(drifted_for)} of them "
        f"Drifted",
        KARPENTER_BOUNDS["G-06"](k),
        detail,
    )


# --- G-07 ---------------------------------------------------------------------------------


def audit_reads_karpenter(
    kit: KarpenterKit, progress: Progress, guards: list[Guard], drift: _Drift
) -> Verdict:
    if not drift.claim:
        raise LaneError("G-06 left no held node to audit")
    progress.note("audit-nodepools over G-06's workers while Karpenter holds the busy node")
    completed = kit.cli(
        "audit-nodepools", f"--namespace={kit.namespace}", f"--selector={kit.selector('g06')}",
        "-o", "json",
    )  # fmt: skip
    claims = kit.nodeclaims(DRIFT_POOL)
    nodes = kit.pool_nodes(DRIFT_POOL)
    drifted = sorted(c["metadata"]["name"] for c in claims if has_condition(c, "Drifted"))
    document = audit_document(completed) or {}
    pools = [p for p in document.get("nodePools") or [] if p.get("name") == DRIFT_POOL]
    read = pools[0] if pools else {}
    fails = {
        f.get("rule") for f in document.get("findings") or []
        if f.get("level") == "FAIL" and f.get("nodePool") == DRIFT_POOL
    }  # fmt: skip
    seen = (read.get("nodes"), read.get("nodeClaims"), read.get("driftedNodeClaims"))
    api = (len(nodes), len(claims), drifted)
    passed = (
        completed.code == 2
        and "no-termination-grace-period" in fails
        and seen == api
        and drifted == [drift.claim]
        and read.get("busyNodes") == 1
    )
    return Verdict(
        "G-07",
        passed,
        f"exit {completed.code}; audit read {seen[0]} node(s), {seen[1]} NodeClaim(s), "
        f"drifted {seen[2]}; the API holds {api[0]}, {api[1]}, drifted {api[2]}",
        KARPENTER_BOUNDS["G-07"](kit.karpenter),
        "" if passed else (completed.stderr.strip()[-300:] or f"FAIL rules {sorted(fails)}"),
    )


# --- G-08 ---------------------------------------------------------------------------------


def release_lets_drift_replace(
    kit: KarpenterKit, progress: Progress, guards: list[Guard], drift: _Drift
) -> Verdict:
    k, w = kit.karpenter, kit.windows
    if not drift.node:
        raise LaneError("G-06 left no held node to release")
    started = time.monotonic()
    kit.set_busy("g06-busy", False)
    cleared = _timed(
        progress, "g06-busy's protection cleared after the idle grace",
        lambda: kit.annotation("g06-busy") is None, k.idle_grace + w.within_tick,
    )  # fmt: skip
    acted = _timed(
        progress, f"Karpenter to replace {drift.node}",
        lambda: _gone_claim(kit, DRIFT_POOL, drift.node), 2 * k.disruption_poll,
    )  # fmt: skip
    total = time.monotonic() - started
    passed = cleared <= k.idle_grace + w.within_tick and acted <= 2 * k.disruption_poll
    return Verdict(
        "G-08",
        passed,
        f"cleared {_seconds(cleared)} after the worker went idle (idle grace "
        f"{k.idle_grace:g} s); Karpenter took the node {_seconds(acted)} later "
        f"({_seconds(total)} in all)",
        KARPENTER_BOUNDS["G-08"](k),
        "" if passed else "cleared or replaced late",
    )


# --- G-09 ---------------------------------------------------------------------------------


def bounded_drift_ends(
    kit: KarpenterKit, progress: Progress, guards: list[Guard], drift: _Drift
) -> Verdict:
    k = kit.karpenter
    (node,) = _provision(kit, progress, BOUNDED_DRIFT_POOL, 1)
    pod = "g09-busy"
    # kwok plays the kubelet: a deleted pod is gone at once, so the drain ends as soon as
    # Karpenter deletes it. (Held Terminating by a finalizer, as on an unreachable kubelet,
    # the node outlived its deadline by up to a minute: Karpenter's termination requeues
    # back off while it waits.)
    kit.pod(pod, "g09", node, grace=k.pod_grace)
    first_deletion = kit.watch_deletion(pod, (k.node_grace + k.slack) * PATIENCE)
    _stamped_before(kit, progress, guards, pod)
    kit.unplace(BOUNDED_DRIFT_POOL)
    progress.note(f"drifting {BOUNDED_DRIFT_POOL} (terminationGracePeriod {k.node_grace} s)")
    started, drifted_at = time.monotonic(), time.time()
    kit.drift(BOUNDED_DRIFT_POOL, "1")
    claim = progress.wait_for(
        f"Karpenter to start draining {node}",
        lambda: (
            (c := _claim_of(kit, BOUNDED_DRIFT_POOL, node))
            and c["metadata"].get("annotations", {}).get(TERMINATION_DEADLINE)
            and c
        ),
        2 * k.disruption_poll * PATIENCE,
    )
    drain_start = _timestamp(claim["metadata"]["deletionTimestamp"])
    deadline = _timestamp(claim["metadata"]["annotations"][TERMINATION_DEADLINE])
    deleted = progress.wait_for(
        f"Karpenter to delete {pod}", first_deletion, (k.node_grace + k.slack) * PATIENCE
    )
    progress.wait_for(
        f"{node}'s NodeClaim gone",
        lambda: _claim_of(kit, BOUNDED_DRIFT_POOL, node) is None,
        (k.node_grace + k.slack) * PATIENCE,
    )
    gone = time.monotonic() - started
    skew = _timestamp(deleted.timestamp) - deadline
    asked = _timestamp(deleted.timestamp) - deleted.grace  # when Karpenter sent the delete
    hold = asked - drifted_at  # the protection held the pod from the drift until then
    ceiling = deadline - drain_start
    problems = []
    if abs(skew) > k.deadline_skew:
        problems.append(f"the pod's deletion strays {skew:+.1f} s from the node's deadline")
    if abs(deadline - asked - k.pod_grace) > k.deadline_skew:
        problems.append(f"the pod was deleted {deadline - asked:.1f} s before the deadline")
    if abs(ceiling - k.node_grace) > k.deadline_skew:
        problems.append(f"the node's deadline is {ceiling:.1f} s after its drain began")
    if max(hold, gone) > k.node_grace + k.slack:
        problems.append("the hold ran past grace + slack")
    return Verdict(
        "G-09",
        not problems,
        f"drain began {drain_start - drifted_at:.1f} s after the drift; node deadline "
        f"{ceiling:.1f} s after; Karpenter deleted the pod {deadline - asked:.1f} s before "
        f"that deadline with grace {deleted.grace} s (deletionTimestamp {skew:+.1f} s from "
        f"the deadline); hold ended {_seconds(hold)} after the drift, node gone "
        f"{_seconds(gone)} after it",
        KARPENTER_BOUNDS["G-09"](k),
        "; ".join(problems),
    )


# --- G-10 ---------------------------------------------------------------------------------


def consolidation_spares_busy_node(
    kit: KarpenterKit, progress: Progress, guards: list[Guard], drift: _Drift
) -> Verdict:
    k, w = kit.karpenter, kit.windows
    busy_node, idle_node = _provision(kit, progress, CONSOLIDATE_POOL, 2)
    kit.pod("g10-busy", "g10", busy_node)
    kit.pod("g10-idle", "g10", idle_node)
    _stamped_before(kit, progress, guards, "g10-busy")
    watch = _Untouched(kit, CONSOLIDATE_POOL, busy_node)
    started = time.monotonic()
    kit.unplace(CONSOLIDATE_POOL)  # both nodes underutilized from now on

    def idle_gone() -> bool | None:
        watch.look()
        return _gone_claim(kit, CONSOLIDATE_POOL, idle_node) or None

    consolidation = _consolidation_bound(k)
    progress.wait_for("the idle node consolidated", idle_gone, consolidation * PATIENCE)
    idle_after = time.monotonic() - started
    held = _hold(progress, watch, k.hold)
    kept = time.monotonic() - started
    released = time.monotonic()
    kit.set_busy("g10-busy", False)
    progress.wait_for(
        "g10-busy's protection cleared", lambda: kit.annotation("g10-busy") is None or None,
        (k.idle_grace + w.within_tick) * PATIENCE,
    )  # fmt: skip
    progress.wait_for(
        f"{busy_node} consolidated once unprotected",
        lambda: _gone_claim(kit, CONSOLIDATE_POOL, busy_node) or None,
        consolidation * PATIENCE,
    )
    after_release = time.monotonic() - released
    passed = watch.touched is None and held >= k.hold and idle_after <= consolidation
    return Verdict(
        "G-10",
        passed,
        f"idle node consolidated {_seconds(idle_after)} after it emptied; busy node kept "
        f"{_seconds(kept)}; consolidated {_seconds(after_release)} after the worker went idle",
        KARPENTER_BOUNDS["G-10"](k),
        "" if passed else (watch.touched or f"the idle node went {idle_after:.1f} s after"),
    )


KarpenterJudge = Callable[[KarpenterKit, Progress, list[Guard], _Drift], Verdict]

KARPENTER_BOUNDS: dict[str, Callable[[KarpenterWindows], str]] = {
    "G-06": lambda k: (
        f"idle nodes gone ≤ {2 * k.disruption_poll:g} s (two disruption passes); busy node "
        f"never tainted or deleted, ≥ {k.hold:g} s with Drifted=True"
    ),
    "G-07": lambda k: "exit 2, FAIL no-termination-grace-period; counts and drifted = the API's",
    "G-08": lambda k: (
        f"cleared ≤ idle grace {k.idle_grace:g} s + 1 tick + delivery; replaced ≤ "
        f"{2 * k.disruption_poll:g} s after"
    ),
    "G-09": lambda k: (
        f"deadline = drain start + {k.node_grace} s; pod deleted {k.pod_grace} s before it, "
        f"for it (± {k.deadline_skew:g} s); hold and node ≤ {k.node_grace} s + {k.slack:g} s "
        f"after the drift"
    ),
    "G-10": lambda k: (
        f"idle node ≤ {_consolidation_bound(k):g} s; busy node never touched for "
        f"≥ {k.hold:g} s; gone once cleared"
    ),
}


def _karpenter_guards(kit: KarpenterKit) -> dict[str, list[tuple[str, str, list[str]]]]:
    idle_grace = f"--idle-grace={kit.karpenter.idle_grace:g}s"
    return {
        # lanes-drift has no terminationGracePeriod: the guard must be told to stamp anyway.
        "g06": [("g06", "g06", [kit.busy_sessions("g06"), idle_grace, "--allow-unbounded"])],
        "g09": [("g09", "g09", [kit.busy_sessions("g09")])],
        "g10": [("g10", "g10", [kit.busy_sessions("g10"), idle_grace])],
    }


class KarpenterScenario:
    """G-06..G-10, on a kit whose control plane runs Karpenter (the tests start
    ``karpenter-kwok`` beside the real control plane; see ``tests/guard/test_karpenter.py``).
    G-07 and G-08 continue from G-06's held node."""

    lanes: tuple[Lane, ...] = KARPENTER_LANES

    def __init__(self, open_kit: OpenKarpenterKit) -> None:
        self.open_kit = open_kit

    def run(self, kit: Kit, selected: frozenset[str], progress: Progress) -> Iterable[Verdict]:
        judges: dict[str, tuple[str, KarpenterJudge]] = {
            "G-06": ("g06", drift_holds_busy_node),
            "G-07": ("g06", audit_reads_karpenter),
            "G-08": ("g06", release_lets_drift_replace),
            "G-09": ("g09", bounded_drift_ends),
            "G-10": ("g10", consolidation_spares_busy_node),
        }
        with self.open_kit(kit) as karpenter_kit:
            progress.note("Karpenter lanes: Karpenter's own controllers act on the guard's pods")
            karpenter_kit.karpenter_nodepool(
                DRIFT_POOL, grace=None, policy="WhenEmpty", consolidate_after="Never"
            )
            karpenter_kit.karpenter_nodepool(
                BOUNDED_DRIFT_POOL, grace=f"{karpenter_kit.karpenter.node_grace}s",
                policy="WhenEmpty", consolidate_after="Never",
            )  # fmt: skip
            karpenter_kit.karpenter_nodepool(
                CONSOLIDATE_POOL, grace="1h", policy="WhenEmptyOrUnderutilized",
                consolidate_after="0s",
            )  # fmt: skip
            specs = _karpenter_guards(karpenter_kit)
            needed = {judges[lane.id][0] for lane in KARPENTER_LANES if lane.id in selected}
            guards = {
                group: [karpenter_kit.spawn_guard(*spec) for spec in specs[group]]
                for group in sorted(needed)
            }
            drift = _Drift()
            for lane in KARPENTER_LANES:
                if lane.id not in selected:
                    continue
                group, judge = judges[lane.id]
                yield _judged_karpenter(lane, karpenter_kit, progress, judge, guards[group], drift)


def _judged_karpenter(
    lane: Lane,
    kit: KarpenterKit,
    progress: Progress,
    judge: KarpenterJudge,
    guards: list[Guard],
    drift: _Drift,
) -> Verdict:
    """As :func:`judged`, but the guards outlive the lane (G-06's serve G-07 and G-08); the
    kit stops them all when it closes."""
    try:
        return judge(kit, progress, guards, drift)
    except (SandboxctlError, ApiException, httpx.HTTPError) as error:
        why = " ".join(str(error).split()) or type(error).__name__
        return Verdict(lane.id, False, "not reached", KARPENTER_BOUNDS[lane.id](kit.karpenter), why)

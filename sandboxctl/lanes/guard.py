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
from typing import Any

import httpx
from kubernetes.client.exceptions import ApiException

from sandboxctl.core.errors import SandboxctlError
from sandboxctl.core.timestamps import parse_rfc3339
from sandboxctl.guard.pods import ANNOTATION
from sandboxctl.lanes.guardkit import (
    OWNER_LABEL,
    Completed,
    Guard,
    GuardKit,
    GuardWindows,
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

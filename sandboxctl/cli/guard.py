"""``sandboxctl guard-workers``: keep Karpenter from draining nodes under busy workers
(``run``), audit the NodePools that bound it (``audit-nodepools``), show a running guard
(``status``), hand pods to a new owner (``adopt``), and clean up (``clear``).

Thin: every rule lives in ``sandboxctl.guard`` (loaded per command: the Kubernetes client
costs the other verbs' start otherwise).
"""

from __future__ import annotations

import contextlib
import json
from datetime import timedelta
from typing import Annotated, Any

import httpx
import typer
from rich.markup import escape
from rich.table import Table

from sandboxctl.cli import render
from sandboxctl.cli.addresses import parse_listen
from sandboxctl.cli.options import (
    AllowUnbounded,
    BusySourceSpec,
    DrainSlack,
    FailLevel,
    FailOn,
    GuardDryRun,
    GuardInterval,
    GuardListen,
    GuardNamespace,
    GuardOff,
    GuardOutput,
    GuardSelector,
    GuardServer,
    IdleGrace,
    Kubeconfig,
    MaxConcurrency,
    MaxRoll,
    NodePoolNames,
    OverrideLabel,
    OwnerLabel,
    PatchTimeout,
    ProbeConcurrency,
    ProbeFailThreshold,
    ProbeTimeout,
    RespectDisruptedTaint,
    TableOrJson,
    TickBudget,
    service_logging,
)
from sandboxctl.core.durations import format_duration
from sandboxctl.core.errors import ConfigurationError, SandboxctlError
from sandboxctl.core.names import REPORTS_API_VERSION
from sandboxctl.guard.pods import OVERRIDE_LABEL
from sandboxctl.lifecycle import Manager

EXIT_SOME_FAILED = 1
DEFAULT_LISTEN = "127.0.0.1:9467"
API_VERSION = REPORTS_API_VERSION

app = typer.Typer(
    name="guard-workers",
    help="Keep Karpenter from draining nodes under busy workers, bounded by the NodePool's "
    "terminationGracePeriod (docs/guard-workers.md).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _settings(
    namespace: str | None,
    selector: str,
    owner_label: str | None,
    override_label: str,
    **more: Any,
) -> Any:
    from sandboxctl.guard.settings import GuardSettings, parse_owner

    key, value = parse_owner(owner_label) if owner_label else (None, None)
    return GuardSettings(
        namespace=namespace or "",
        selector=selector,
        owner_label=key,
        owner=value,
        override_label=override_label,
        **more,
    ).validate()


@app.command("run")
def run(
    busy_source: BusySourceSpec,
    namespace: GuardNamespace = None,
    selector: GuardSelector = "",
    owner_label: OwnerLabel = None,
    override_label: OverrideLabel = OVERRIDE_LABEL,
    kubeconfig: Kubeconfig = None,
    interval: GuardInterval = timedelta(seconds=2),
    idle_grace: IdleGrace = timedelta(0),
    patch_timeout: PatchTimeout = timedelta(seconds=10),
    max_concurrency: MaxConcurrency = 8,
    tick_budget: TickBudget = None,
    probe_timeout: ProbeTimeout = timedelta(seconds=3),
    probe_fail_threshold: ProbeFailThreshold = 3,
    probe_concurrency: ProbeConcurrency = 16,
    drain_slack: DrainSlack = timedelta(seconds=30),
    respect_disrupted_taint: RespectDisruptedTaint = True,
    nodepool: NodePoolNames = None,
    max_roll: MaxRoll = None,
    allow_unbounded: AllowUnbounded = False,
    dry_run: GuardDryRun = False,
    listen: GuardListen = DEFAULT_LISTEN,
) -> None:
    """Reconcile karpenter.sh/do-not-disrupt onto busy worker pods and off idle ones,
    every --interval and on every change, until SIGTERM or SIGINT."""
    from sandboxctl.guard.metrics import GuardMetrics
    from sandboxctl.guard.serve import GuardHttp
    from sandboxctl.guard.service import Guard
    from sandboxctl.guard.sources import parse_busy_source, source_factory
    from sandboxctl.kube import api_client

    log = service_logging("sandboxctl.guard")
    settings = _settings(
        namespace,
        selector,
        owner_label,
        override_label,
        interval=interval,
        idle_grace=idle_grace,
        patch_timeout=patch_timeout,
        max_concurrency=max_concurrency,
        tick_budget=tick_budget,
        probe_timeout=probe_timeout,
        probe_fail_threshold=probe_fail_threshold,
        drain_slack=drain_slack,
        respect_disrupted_taint=respect_disrupted_taint,
        dry_run=dry_run,
    )
    if probe_concurrency < 1:
        raise ConfigurationError("--probe-concurrency must be at least 1")
    spec = parse_busy_source(busy_source)
    host, port = parse_listen("--listen", listen)
    api = api_client(kubeconfig)
    metrics = GuardMetrics()
    guard = Guard(
        settings,
        api,
        source_factory(spec, settings, api, probe_concurrency=probe_concurrency),
        metrics=metrics,
        nodepools=nodepool or (),
        max_roll=max_roll,
        allow_unbounded=allow_unbounded,
        printer=typer.echo,
    )
    http = GuardHttp(metrics.registry, guard.status, lambda: guard.ready)
    manager = Manager()
    manager.stopping.on_set(guard.stop)  # a signal during the first sync ends it too
    with manager, contextlib.ExitStack() as running:
        running.callback(api.close)
        running.callback(http.close)
        running.callback(guard.close)
        bound = http.serve(host, port)
        log.info(
            "event=starting namespace=%s selector=%r source=%s interval=%s dry_run=%s "
            "status=http://%s:%d/status",
            settings.namespace, settings.label_selector, spec.kind.value,
            format_duration(interval), str(dry_run).lower(), host, bound,
        )  # fmt: skip
        if not guard.start():
            return
        guard.gate()
        manager.add(guard)
        code = manager.run()
        log.info(
            "event=stopped (annotations are left as they are: guard-workers clear removes them)"
        )
    if code:
        raise typer.Exit(code)


@app.command("audit-nodepools")
def audit_nodepools(
    namespace: GuardNamespace = None,
    selector: GuardSelector = "",
    owner_label: OwnerLabel = None,
    nodepool: NodePoolNames = None,
    max_roll: MaxRoll = None,
    fail_on: FailOn = FailLevel.FAIL,
    guard_off: GuardOff = False,
    kubeconfig: Kubeconfig = None,
    output: GuardOutput = TableOrJson.TABLE,
) -> None:
    """Audit the NodePools under the worker pods (and --nodepool): exit 0 ok, 1 warn,
    2 fail (--fail-on warn: 2 on a warning too)."""
    from sandboxctl.guard.audit import Level, audit
    from sandboxctl.guard.karpenter import read_audit_input
    from sandboxctl.guard.pods import pod_view
    from sandboxctl.kube import PODS, CoreObjects, api_client

    if not namespace and not nodepool:
        raise ConfigurationError(
            "name the workers (--namespace and --selector) or the NodePools (--nodepool)"
        )
    api = api_client(kubeconfig)
    try:
        views = []
        if namespace:
            settings = _settings(namespace, selector, owner_label, OVERRIDE_LABEL)
            pods = CoreObjects(api, PODS).list(namespace, settings.label_selector).items
            views = [pod_view(obj, settings.shape) for obj in pods]
        given = read_audit_input(
            api,
            views,
            configured=nodepool or (),
            guard_enabled=not guard_off,
            max_roll=max_roll,
        )
    finally:
        api.close()  # type: ignore[no-untyped-call]
    report = audit(given)
    code = report.exit_code(Level.WARN if fail_on is FailLevel.WARN else Level.FAIL)
    if output is TableOrJson.JSON:
        typer.echo(json.dumps(_audit_document(report, code), indent=2))
    else:
        _print_audit(report, code)
    if code:
        raise typer.Exit(code)


@app.command("status")
def status(
    server: GuardServer = f"http://{DEFAULT_LISTEN}",
    output: GuardOutput = TableOrJson.TABLE,
) -> None:
    """What a running guard watches: guarded, busy, annotated, mismatched, deferred."""
    url = server.rstrip("/") + "/status"
    try:
        response = httpx.get(url, timeout=10)
        response.raise_for_status()
        document = response.json()
    except (httpx.HTTPError, ValueError) as error:
        raise SandboxctlError(f"cannot read {url}: {' '.join(str(error).split())}") from None
    if output is TableOrJson.JSON:
        typer.echo(json.dumps(document, indent=2))
        return
    _print_status(document)


@app.command("clear")
def clear(
    namespace: GuardNamespace = None,
    selector: GuardSelector = "",
    owner_label: OwnerLabel = None,
    override_label: OverrideLabel = OVERRIDE_LABEL,
    kubeconfig: Kubeconfig = None,
    dry_run: GuardDryRun = False,
    output: GuardOutput = TableOrJson.TABLE,
) -> None:
    """Remove the annotation from every pod the guard manages (an uninstall; stop the
    guard first). Exit 1 when a patch failed."""
    from sandboxctl.guard.clear import ClearResult, clear_annotations
    from sandboxctl.kube import PODS, CoreObjects, Pods, api_client

    settings = _settings(namespace, selector, owner_label, override_label)
    api = api_client(kubeconfig)
    calls = Pods(api)
    try:
        rows = clear_annotations(
            settings,
            lambda: CoreObjects(api, PODS).list(settings.namespace, settings.label_selector).items,
            lambda ns, name, body: calls.patch(ns, name, body, timeout=10.0),
            dry_run=dry_run,
        )
    finally:
        api.close()  # type: ignore[no-untyped-call]
    failed = [r for r in rows if r.result is ClearResult.FAILED]
    if output is TableOrJson.JSON:
        document = {
            "apiVersion": API_VERSION,
            "kind": "GuardClear",
            "dryRun": dry_run,
            "pods": [
                {"namespace": r.namespace, "name": r.name, "uid": r.uid, "result": r.result.value,
                 "pinned": r.pinned, **({"error": r.error} if r.error else {})}
                for r in rows
            ],
        }  # fmt: skip
        typer.echo(json.dumps(document, indent=2))
    else:
        table = Table("NAMESPACE", "NAME", "RESULT", "NOTE", box=None)
        for r in rows:
            note = r.error or ("pinned by the override label" if r.pinned else "")
            table.add_row(r.namespace, r.name, r.result.value, escape(note))
        render.console().print(table)
        render.console().print(f"{len(rows)} annotated pod(s), {len(failed)} failed")
    if failed:
        raise typer.Exit(EXIT_SOME_FAILED)


@app.command("adopt")
def adopt(
    owner_label: OwnerLabel = None,
    namespace: GuardNamespace = None,
    selector: GuardSelector = "",
    from_owner: Annotated[
        str | None,
        typer.Option(
            "--from",
            metavar="VALUE",
            help="Take only pods whose owner label is VALUE ('' for unlabelled ones).",
        ),
    ] = None,
    pod: Annotated[
        list[str] | None,
        typer.Option("--pod", metavar="NAME", help="Only this pod (repeatable)."),
    ] = None,
    kubeconfig: Kubeconfig = None,
    dry_run: GuardDryRun = False,
    output: GuardOutput = TableOrJson.TABLE,
) -> None:
    """Hand worker pods to the owner --owner-label KEY=VALUE names: a conditional relabel
    (refused on a newer owner, never on a Terminating pod). Exit 1 when one was refused."""
    from sandboxctl.guard.adopt import Adopted, AlreadyOwned, Refused
    from sandboxctl.guard.adopt import adopt as adopt_pod
    from sandboxctl.guard.pods import pod_view
    from sandboxctl.kube import PODS, CoreObjects, Pods, api_client

    if not owner_label:
        raise ConfigurationError("--owner-label KEY=VALUE names the new owner: it is required")
    settings = _settings(namespace, selector, owner_label, OVERRIDE_LABEL)
    key, value = settings.owner_label, settings.owner
    api = api_client(kubeconfig)
    calls = Pods(api)
    rows: list[dict[str, Any]] = []
    try:
        candidates = [
            pod_view(obj, settings.shape)
            for obj in CoreObjects(api, PODS).list(settings.namespace, settings.selector).items
        ]
        for view in candidates:
            current = view.owner or ""
            if (pod and view.name not in pod) or current == value:
                continue
            if from_owner is not None and current != from_owner:
                continue
            row = {"namespace": view.namespace, "name": view.name, "from": current or None}
            if dry_run:
                outcome_text, refused = "would-adopt", False
            else:
                outcome = adopt_pod(calls, view.namespace, view.name, key, value, expected=current)
                refused = isinstance(outcome, Refused)
                if isinstance(outcome, Adopted):
                    outcome_text = "adopted"
                elif isinstance(outcome, AlreadyOwned):
                    outcome_text = "already-owned"
                else:
                    outcome_text = f"refused: {outcome.reason.value}"
                    if outcome.owner:
                        outcome_text += f" ({outcome.owner})"
            rows.append({**row, "result": outcome_text, "refused": refused})
    finally:
        api.close()  # type: ignore[no-untyped-call]
    if output is TableOrJson.JSON:
        typer.echo(json.dumps({"apiVersion": API_VERSION, "kind": "GuardAdopt",
                               "owner": f"{key}={value}", "pods": rows}, indent=2))  # fmt: skip
    else:
        table = Table("NAMESPACE", "NAME", "FROM", "RESULT", box=None)
        for r in rows:
            table.add_row(r["namespace"], r["name"], r["from"] or "-", r["result"])
        render.console().print(table)
    if any(r["refused"] for r in rows):
        raise typer.Exit(EXIT_SOME_FAILED)


# --- output ----------------------------------------------------------------------------------


def _audit_document(report: Any, code: int) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "NodePoolAudit",
        "verdict": report.verdict.value,
        "exitCode": code,
        "guardEnabled": report.guard_enabled,
        "nodePools": [
            {
                "name": p.name,
                "found": p.found,
                "terminationGracePeriod": _duration(p.termination_grace),
                "expireAfter": p.expire_after,
                "consolidationPolicy": p.consolidation_policy,
                "consolidateAfter": p.consolidate_after,
                "nodes": p.nodes,
                "busyNodes": p.busy_nodes,
                "workers": p.workers,
                "workerGraceSeconds": p.worker_grace_seconds,
                "budgets": dict(p.budgets),
                "worstCaseRoll": _duration(p.worst_case_roll),
                "nodeClaims": p.claims,
                "nodeClaimsWithoutCeiling": p.claims_without_ceiling,
                "disruptedNodes": list(p.disrupted_nodes),
                "driftedNodeClaims": list(p.drifted_claims),
            }
            for p in report.pools
        ],
        "findings": [
            {
                "level": f.level.value.upper(),
                "nodePool": f.nodepool,
                "rule": f.rule,
                "message": f.message,
            }
            for f in report.findings
        ],
    }


def _print_audit(report: Any, code: int) -> None:
    console = render.console()
    table = Table("LEVEL", "NODEPOOL", "RULE", "MESSAGE", box=None)
    style = {"fail": "bold red", "warn": "yellow", "info": "", "ok": ""}
    for f in report.findings:
        level = f.level.value
        table.add_row(f"[{style[level]}]{level.upper()}[/]" if style[level] else level.upper(),
                      f.nodepool or "-", f.rule, escape(f.message))  # fmt: skip
    console.print(table)
    console.print(f"verdict: {report.verdict.value} (exit {code})")


def _print_status(document: dict[str, Any]) -> None:
    console = render.console()
    counts = document.get("counts") or {}
    audit = (document.get("audit") or {}).get("verdict", "?")
    console.print(
        f"synced={str(document.get('synced')).lower()} source={document.get('source')} "
        f"selector={document.get('selector') or '-'} audit={audit} "
        + " ".join(f"{k}={v}" for k, v in counts.items())
    )
    table = Table(
        "NAMESPACE", "NAME", "NODE", "BUSY", "ANNOTATED", "DECISION", "HEALTH", "DETAIL", box=None
    )
    for row in document.get("pods") or []:
        health = row.get("health", "")
        if health == "deferred":
            health += f" until {row.get('deadline')}"
        table.add_row(
            row["namespace"], row["name"], row.get("node") or "-", row["busy"],
            "yes" if row["annotated"] else "no", row["decision"], health,
            escape(row.get("detail", "")),
        )  # fmt: skip
    console.print(table)


def _duration(value: timedelta | None) -> str | None:
    return format_duration(value) if value is not None else None

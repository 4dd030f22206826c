"""Flags shared by every command that has the behaviour behind them, defined once."""

from __future__ import annotations

import enum
import logging
from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer

# Defined in the light module (status parses its flags without this one's imports).
from sandboxctl.cli.flags import Kubeconfig as Kubeconfig
from sandboxctl.cli.flags import StaleAfter as StaleAfter
from sandboxctl.cli.flags import TableOrJson as TableOrJson
from sandboxctl.cli.flags import TableOrJsonOutput
from sandboxctl.cli.flags import parse_duration_flag as parse_duration_flag
from sandboxctl.cli.flags import parse_time_flag as parse_time_flag
from sandboxctl.cli.logs import escape_every_record
from sandboxctl.core.durations import format_duration
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.freshness import (
    DEFAULT_PUBLISH_INTERVAL,
    FreshnessRule,
    ReferenceMode,
)
from sandboxctl.core.model import PoolKey
from sandboxctl.sandboxd.runtimedir import RUNTIME_ROOT_ENV
from sandboxctl.sandboxd.templates.store import STORE_ENV
from sandboxctl.serving.bounds import (
    DEFAULT_BODY_IDLE_TIMEOUT,
    DEFAULT_HEAD_TIMEOUT,
    ReadBounds,
)

Reference = Annotated[
    ReferenceMode,
    typer.Option(
        "--inventory-reference",
        "--reference",
        help="publish: reference = min(newest publish, now). extrapolate: also advance it "
        "with this reader's clock by at most one publish interval.",
        case_sensitive=False,
    ),
]
PublishInterval = Annotated[
    timedelta,
    typer.Option(
        "--publish-interval",
        parser=parse_duration_flag,
        metavar="DURATION",
        help="How often every node publishes its inventory.",
        show_default=format_duration(DEFAULT_PUBLISH_INTERVAL),
    ),
]

RuntimeRoot = Annotated[
    Path,
    typer.Option(
        "--runtime-root",
        envvar=RUNTIME_ROOT_ENV,
        help="Where the directories sandbox uids must reach (their homes) are kept, one "
        "per --state-dir; every uid may traverse it, only root may write it.",
    ),
]

TemplateStoreDir = Annotated[
    Path,
    typer.Option(
        "--template-store",
        envvar=STORE_ENV,
        metavar="DIR",
        help="The template store (sandboxctl template build): every template built into it "
        "is served by its name. Every uid may traverse it, only root may write it.",
    ),
]
StoreDir = Annotated[
    Path,
    typer.Option(
        "--store",
        envvar=STORE_ENV,
        metavar="DIR",
        help="The template store: every uid may traverse it, only root may write it.",
    ),
]

SandboxCidr = Annotated[
    str,
    typer.Option(
        "--sandbox-cidr",
        metavar="CIDR|auto",
        help="The IPv4 subnet this agent's sandboxes get addresses from (its first address "
        "is their gateway). auto: a free /24 of 10.200.0.0/16, kept across restarts. One "
        "that overlaps a route or address of the host, or another agent's, is refused.",
    ),
]

SandboxDns = Annotated[
    str,
    typer.Option(
        "--sandbox-dns",
        metavar="IP[:PORT]|host|none",
        help="Where the DNS forwarder on the sandboxes' gateway sends queries of sandboxes "
        "with internet. host: the first nameserver of /etc/resolv.conf; none: no DNS.",
    ),
]


KubeTokenFile = Annotated[
    Path | None,
    typer.Option(
        "--kube-token-file",
        metavar="FILE",
        help="Bearer tokens of the Sandbox API, one per line: 'token namespace...' "
        "('*': every namespace). Required: every request but /healthz needs one.",
    ),
]
TlsCertFile = Annotated[
    Path | None,
    typer.Option(
        "--tls-cert-file",
        metavar="FILE",
        help="Serve HTTPS with this certificate (PEM, chain after it), with "
        "--tls-private-key-file.",
    ),
]
TlsKeyFile = Annotated[
    Path | None,
    typer.Option(
        "--tls-private-key-file",
        metavar="FILE",
        help="The private key (PEM) of --tls-cert-file.",
    ),
]

# --- every listener (serving/bounds.py) ----------------------------------------------------

RequestHeadTimeout = Annotated[
    timedelta,
    typer.Option(
        "--request-head-timeout",
        parser=parse_duration_flag,
        metavar="DURATION",
        help="How long a request head may take to arrive, from its connection's start or "
        "its first byte after a keep-alive; past it: 408, and the connection is closed.",
        show_default=format_duration(timedelta(seconds=DEFAULT_HEAD_TIMEOUT)),
    ),
]
RequestBodyIdleTimeout = Annotated[
    timedelta,
    typer.Option(
        "--request-body-idle-timeout",
        parser=parse_duration_flag,
        metavar="DURATION",
        help="Close a connection whose request body has sent nothing for this long "
        "(responses are not bounded: a watch or a command's output lasts as it needs).",
        show_default=format_duration(timedelta(seconds=DEFAULT_BODY_IDLE_TIMEOUT)),
    ),
]
MaxConnections = Annotated[
    int,
    typer.Option(
        "--max-connections",
        min=1,
        metavar="N",
        help="Most connections each listener holds at once; one more is closed at once.",
    ),
]
HEAD_TIMEOUT = timedelta(seconds=DEFAULT_HEAD_TIMEOUT)
BODY_IDLE_TIMEOUT = timedelta(seconds=DEFAULT_BODY_IDLE_TIMEOUT)


def read_bounds(head: timedelta, body_idle: timedelta, max_connections: int) -> ReadBounds:
    """The listeners' bounds the flags describe; a duration of 0 or less is refused."""
    for flag, value in (
        ("--request-head-timeout", head),
        ("--request-body-idle-timeout", body_idle),
    ):
        if value <= timedelta(0):
            raise InvalidValueError(f"{flag} {format_duration(value)}: must be above 0s")
    return ReadBounds(head.total_seconds(), body_idle.total_seconds(), max_connections)


Recover = Annotated[
    bool,
    typer.Option(
        "--recover",
        help="If the agent's state database cannot be read: move it aside, destroy the "
        "sandboxes it held (found by their files and uids), then start afresh.",
    ),
]


def freshness_rule(
    stale_after: timedelta,
    reference: ReferenceMode,
    publish_interval: timedelta,
    allow_unsafe: bool = False,
    log: logging.Logger | None = None,
) -> FreshnessRule:
    """The rule the flags describe, refused (one line, exit 2) when it cannot be safe;
    with ``log``, each risk it still carries is logged as a warning."""
    rule = FreshnessRule(stale_after, reference, publish_interval).validate(allow_unsafe)
    if log is not None:
        for warning in rule.warnings():
            log.warning("freshness: %s", warning)
    return rule


def service_logging(name: str) -> logging.Logger:
    """Timestamped lines at INFO for a long-lived service, without httpx's line per
    request (one per inventory poll), each record's control characters escaped (what a
    client chose cannot start a line of its own: logs.py); the service's own logger."""
    escape_every_record()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return logging.getLogger(name)


def parse_pool_flag(text: str) -> tuple[PoolKey, int]:
    """``--pool TEMPLATE[/NET[/SIZE]]=N``, as the agent and ``serve`` take it."""
    key_text, eq, count = text.partition("=")
    parts = key_text.split("/")
    if not eq or not key_text or len(parts) > 3 or not count.isdigit():
        raise InvalidValueError(f"--pool {text!r}: expected TEMPLATE[/NET[/SIZE]]=N, e.g. base=4")
    return PoolKey.of(*parts), int(count)


# --- guard-workers ------------------------------------------------------------------------
# (defaults are the guard's own; guard.settings holds them without the client's imports)


GuardOutput = TableOrJsonOutput
LanesOutput = GuardOutput  # the same flag on ``lanes list`` and ``lanes run``
GuardNamespace = Annotated[
    str | None,
    typer.Option("--namespace", "-n", metavar="NS", help="The namespace of the worker pods."),
]
GuardSelector = Annotated[
    str,
    typer.Option(
        "--selector",
        "-l",
        metavar="SELECTOR",
        help="The label selector that chooses the worker pods, e.g. app=worker.",
    ),
]
OwnerLabel = Annotated[
    str | None,
    typer.Option(
        "--owner-label",
        metavar="KEY=VALUE",
        help="Single-writer mode: only pods labelled KEY=VALUE are this guard's (the label "
        "means nothing else; --selector must not name KEY).",
    ),
]
OverrideLabel = Annotated[
    str,
    typer.Option(
        "--override-label",
        metavar="KEY",
        help="A pod labelled KEY=pin keeps the annotation, KEY=off never has it, whatever "
        "its busy state.",
    ),
]
GuardDryRun = Annotated[
    bool, typer.Option("--dry-run", help="Print the patches it would send; send none.")
]
NodePoolNames = Annotated[
    list[str] | None,
    typer.Option(
        "--nodepool",
        metavar="NAME",
        help="A NodePool the workers run on (repeatable): audited even before a worker runs there.",
    ),
]
MaxRoll = Annotated[
    timedelta | None,
    typer.Option(
        "--max-roll",
        parser=parse_duration_flag,
        metavar="DURATION",
        help="WARN when a NodePool's terminationGracePeriod is above this (e.g. the CVE roll SLA).",
    ),
]
BusySourceSpec = Annotated[
    str,
    typer.Option(
        "--busy-source",
        metavar="SPEC",
        help="Where busy comes from: sessions=URL ({pod: count}), probe=URL-TEMPLATE "
        "({name} {namespace} {ip} {node} {uid}; answers {busy, queries}), "
        "annotation=KEY (workers report on their pod), or sandbox-hosts (claimed "
        "sandboxes in the node's NodeInventory).",
    ),
]
GuardInterval = Annotated[
    timedelta,
    typer.Option(
        "--interval",
        parser=parse_duration_flag,
        metavar="DURATION",
        help="How often to reconcile (and poll sessions or probes); changes also "
        "reconcile at once.",
        show_default="2s",
    ),
]
IdleGrace = Annotated[
    timedelta,
    typer.Option(
        "--idle-grace",
        parser=parse_duration_flag,
        metavar="DURATION",
        help="Clear the annotation only after the pod has been idle this long.",
        show_default="0s",
    ),
]
PatchTimeout = Annotated[
    timedelta,
    typer.Option(
        "--patch-timeout",
        parser=parse_duration_flag,
        metavar="DURATION",
        help="Timeout of each API call.",
        show_default="10s",
    ),
]
MaxConcurrency = Annotated[
    int, typer.Option("--max-concurrency", metavar="N", help="Patches in flight at once.")
]
TickBudget = Annotated[
    timedelta | None,
    typer.Option(
        "--tick-budget",
        parser=parse_duration_flag,
        metavar="DURATION",
        help="How long one tick waits for its patches; the rest waits for the next tick. "
        "Default: --interval.",
    ),
]
ProbeTimeout = Annotated[
    timedelta,
    typer.Option(
        "--probe-timeout",
        parser=parse_duration_flag,
        metavar="DURATION",
        help="Timeout of one probe, or of one read of the sessions endpoint.",
        show_default="3s",
    ),
]
ProbeFailThreshold = Annotated[
    int,
    typer.Option(
        "--probe-fail-threshold",
        metavar="N",
        help="Failed probes in a row before a worker is judged (deferred or lost).",
    ),
]
ProbeConcurrency = Annotated[
    int, typer.Option("--probe-concurrency", metavar="N", help="Probes in flight at once.")
]
DrainSlack = Annotated[
    timedelta,
    typer.Option(
        "--drain-slack",
        parser=parse_duration_flag,
        metavar="DURATION",
        help="A busy Terminating worker is declared lost at deletionTimestamp (its delete "
        "plus grace) plus this.",
        show_default="30s",
    ),
]
RespectDisruptedTaint = Annotated[
    bool,
    typer.Option(
        "--respect-disrupted-taint/--ignore-disrupted-taint",
        help="Do not newly stamp pods on a node tainted karpenter.sh/disrupted (needs "
        "nodes get/list/watch).",
    ),
]
AllowUnbounded = Annotated[
    bool,
    typer.Option(
        "--allow-unbounded",
        help="Stamp even when the NodePool audit FAILs (no terminationGracePeriod): busy "
        "pods may then block drift and expiry indefinitely.",
    ),
]
GuardListen = Annotated[
    str,
    typer.Option(
        "--listen",
        metavar="HOST:PORT",
        help="Serve /metrics, /status and /healthz here; port 0 picks one.",
    ),
]
GuardServer = Annotated[
    str,
    typer.Option("--server", metavar="URL", help="The running guard's --listen address."),
]


class FailLevel(enum.StrEnum):
    FAIL = "fail"
    WARN = "warn"


FailOn = Annotated[
    FailLevel,
    typer.Option("--fail-on", help="Exit 2 on a FAIL, or on a WARN too.", case_sensitive=False),
]
GuardOff = Annotated[
    bool,
    typer.Option(
        "--guard-off",
        help="Audit a cluster where the guard does not stamp: an unset "
        "terminationGracePeriod is then no FAIL.",
    ),
]

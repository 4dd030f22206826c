"""Flags shared by every command that has the behaviour behind them, defined once."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer

from sandboxctl.core.durations import format_duration, parse_duration
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.freshness import (
    DEFAULT_PUBLISH_INTERVAL,
    DEFAULT_STALE_AFTER,
    FreshnessRule,
    ReferenceMode,
)
from sandboxctl.core.model import PoolKey
from sandboxctl.core.timestamps import parse_rfc3339
from sandboxctl.sandboxd.runtimedir import RUNTIME_ROOT_ENV


def parse_duration_flag(value: str | timedelta) -> timedelta:
    """Typer parser for duration flags; a bad value names the flag via click."""
    if isinstance(value, timedelta):
        return value
    try:
        return parse_duration(value)
    except InvalidValueError as error:
        raise typer.BadParameter(str(error)) from None


def parse_time_flag(value: str | datetime) -> datetime:
    """Typer parser for RFC 3339 flags."""
    if isinstance(value, datetime):
        return value
    try:
        return parse_rfc3339(value)
    except InvalidValueError as error:
        raise typer.BadParameter(str(error)) from None


StaleAfter = Annotated[
    timedelta,
    typer.Option(
        "--inventory-stale-after",
        "--stale-after",
        parser=parse_duration_flag,
        metavar="DURATION",
        help="Drop a node whose publish trails the reference by more than this.",
        show_default=format_duration(DEFAULT_STALE_AFTER),
    ),
]
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
    request (one per inventory poll); the service's own logger."""
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

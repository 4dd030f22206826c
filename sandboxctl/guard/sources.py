"""``--busy-source``: which source, read from its flag, and built for a guard."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kubernetes import client

from sandboxctl.clock import Clock
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.guard.busy import AnnotationSource, BusySource
from sandboxctl.guard.hosts import SandboxHostsSource
from sandboxctl.guard.probe import OnVerdict, ProbeSource, check_template
from sandboxctl.guard.service import PodsFn, SourceFactory
from sandboxctl.guard.sessions import SessionsSource
from sandboxctl.guard.settings import GuardSettings

DEFAULT_PROBE_CONCURRENCY = 16


class SourceKind(enum.StrEnum):
    SESSIONS = "sessions"
    PROBE = "probe"
    ANNOTATION = "annotation"
    SANDBOX_HOSTS = "sandbox-hosts"


@dataclass(frozen=True, slots=True)
class BusySpec:
    kind: SourceKind
    argument: str = ""


def parse_busy_source(text: str) -> BusySpec:
    """``sessions=URL``, ``probe=URL-TEMPLATE``, ``annotation=KEY`` or ``sandbox-hosts``."""
    name, eq, argument = text.partition("=")
    try:
        kind = SourceKind(name.strip())
    except ValueError:
        raise InvalidValueError(
            f"--busy-source {text!r}: expected sessions=URL, probe=URL-TEMPLATE, "
            "annotation=KEY or sandbox-hosts"
        ) from None
    if kind is SourceKind.SANDBOX_HOSTS:
        if eq:
            raise InvalidValueError("--busy-source sandbox-hosts takes no value")
        return BusySpec(kind)
    if not argument:
        raise InvalidValueError(f"--busy-source {kind.value}=...: the value is missing")
    if kind is SourceKind.PROBE:
        check_template(argument)
    if kind is SourceKind.SESSIONS and not argument.startswith(("http://", "https://")):
        raise InvalidValueError(f"--busy-source sessions={argument}: expected an http(s) URL")
    return BusySpec(kind, argument)


def source_factory(
    spec: BusySpec,
    settings: GuardSettings,
    api: client.ApiClient,
    clock: Clock | None = None,
    probe_concurrency: int = DEFAULT_PROBE_CONCURRENCY,
) -> SourceFactory:
    interval = settings.interval.total_seconds()
    timeout = settings.probe_timeout.total_seconds()

    def make(pods: PodsFn, on_verdict: OnVerdict) -> BusySource:
        if spec.kind is SourceKind.SESSIONS:
            return SessionsSource(spec.argument, interval, timeout)
        if spec.kind is SourceKind.PROBE:
            return ProbeSource(
                spec.argument,
                pods,
                interval=interval,
                timeout=timeout,
                threshold=settings.probe_fail_threshold,
                slack=settings.drain_slack,
                concurrency=probe_concurrency,
                clock=clock,
                on_verdict=on_verdict,
            )
        if spec.kind is SourceKind.ANNOTATION:
            return AnnotationSource(spec.argument)
        return SandboxHostsSource(api)

    return make

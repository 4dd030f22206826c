"""The guard's settings, one typed object passed to every part (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sandboxctl.core.durations import format_duration
from sandboxctl.core.errors import ConfigurationError, InvalidValueError
from sandboxctl.core.selectors import LabelSelector
from sandboxctl.guard.decide import Rules
from sandboxctl.guard.health import DEFAULT_DRAIN_SLACK, DEFAULT_FAIL_THRESHOLD
from sandboxctl.guard.pods import ANNOTATION, OVERRIDE_LABEL, PodShape

DEFAULT_INTERVAL = timedelta(seconds=2)
DEFAULT_PATCH_TIMEOUT = timedelta(seconds=10)
DEFAULT_MAX_CONCURRENCY = 8
DEFAULT_IDLE_GRACE = timedelta(0)
DEFAULT_PROBE_TIMEOUT = timedelta(seconds=3)
DEFAULT_BACKOFF_INITIAL = timedelta(seconds=1)
DEFAULT_BACKOFF_MAX = timedelta(minutes=5)


@dataclass(frozen=True)
class GuardSettings:
    namespace: str
    selector: str = ""
    owner_label: str | None = None
    owner: str | None = None
    annotation: str = ANNOTATION
    override_label: str = OVERRIDE_LABEL
    interval: timedelta = DEFAULT_INTERVAL
    patch_timeout: timedelta = DEFAULT_PATCH_TIMEOUT
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    tick_budget: timedelta | None = None  # default: one interval
    idle_grace: timedelta = DEFAULT_IDLE_GRACE
    backoff_initial: timedelta = DEFAULT_BACKOFF_INITIAL
    backoff_max: timedelta = DEFAULT_BACKOFF_MAX
    respect_disrupted_taint: bool = True
    dry_run: bool = False
    conflict_retries: int = 3
    probe_timeout: timedelta = DEFAULT_PROBE_TIMEOUT
    probe_fail_threshold: int = DEFAULT_FAIL_THRESHOLD
    drain_slack: timedelta = DEFAULT_DRAIN_SLACK

    def validate(self) -> GuardSettings:
        """Refuse settings that cannot work (one line each); returns self."""
        if not self.namespace:
            raise ConfigurationError("--namespace is required: the guard watches one namespace")
        for flag, value in (
            ("--interval", self.interval),
            ("--patch-timeout", self.patch_timeout),
            ("--probe-timeout", self.probe_timeout),
        ):
            if value <= timedelta(0):
                raise ConfigurationError(f"{flag} must be positive, got {format_duration(value)}")
        if self.tick_budget is not None and self.tick_budget <= timedelta(0):
            raise ConfigurationError("--tick-budget must be positive")
        if self.idle_grace < timedelta(0):
            raise ConfigurationError("--idle-grace must not be negative")
        if self.max_concurrency < 1:
            raise ConfigurationError("--max-concurrency must be at least 1")
        if self.probe_fail_threshold < 1:
            raise ConfigurationError("--probe-fail-threshold must be at least 1")
        try:
            selector = LabelSelector.parse(self.selector)
        except InvalidValueError as error:
            raise ConfigurationError(f"--selector {self.selector!r}: {error}") from None
        if self.owner_label is not None:
            keys = {requirement.key for requirement in selector.requirements}
            if self.owner_label in keys:
                # One label, one meaning: the owner label says who writes, nothing else.
                raise ConfigurationError(
                    f"--selector must not constrain the owner label {self.owner_label!r}: "
                    "--owner-label alone chooses the owner's pods"
                )
            if self.owner_label == self.override_label:
                raise ConfigurationError("--owner-label and --override-label must differ")
        return self

    @property
    def label_selector(self) -> str:
        """The informer's selector: ``--selector`` and, when set, the owner's label."""
        parts = [self.selector] if self.selector else []
        if self.owner_label is not None and self.owner is not None:
            parts.append(f"{self.owner_label}={self.owner}")
        return ",".join(parts)

    @property
    def shape(self) -> PodShape:
        return PodShape(self.annotation, self.override_label, self.owner_label)

    @property
    def rules(self) -> Rules:
        return Rules(
            idle_grace=self.idle_grace.total_seconds(),
            resend_after=self.interval.total_seconds(),
            respect_disrupted_taint=self.respect_disrupted_taint,
        )

    @property
    def budget(self) -> float:
        return (self.tick_budget or self.interval).total_seconds()


def parse_owner(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` of ``--owner-label``."""
    key, eq, value = text.partition("=")
    if not eq or not key or not value:
        raise InvalidValueError(f"--owner-label {text!r}: expected KEY=VALUE")
    return key, value

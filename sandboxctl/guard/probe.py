"""``--busy-source probe=URL-TEMPLATE``: ask each worker, and guard the draining ones.

Every ``interval`` each guarded pod is probed (at most ``concurrency`` at once, each with
``timeout``) at the template filled with its ``{name}``, ``{namespace}``, ``{ip}``,
``{node}`` and ``{uid}``. A 2xx answer ``{"busy": bool}`` and/or ``{"queries": n}`` is
busy when ``busy`` is true or ``queries`` is positive: a running query, not merely an open
session, so an idle-held connection does not pin its node.

This is also the health guard's probe-mode loop (``health``): a failed probe keeps the
last reading; at ``threshold`` failures in a row the worker is judged. A busy Terminating
worker is **deferred** until its drain deadline and then declared **lost**; an idle
Terminating one and an unresponsive live one are lost at once. A lost worker reads idle
(its work is gone), so its annotation is cleared; a Terminating pod is never patched
anyway. A pod that leaves the cache (deleted, or relabelled out of the selector) is
forgotten quietly: leaving the selector is not dying, and the guard never deletes.
"""

from __future__ import annotations

import logging
import string
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta

import httpx

from sandboxctl.clock import Clock, SystemClock
from sandboxctl.core.errors import ConfigurationError
from sandboxctl.guard.busy import Changed, ignore_change
from sandboxctl.guard.decide import Busy
from sandboxctl.guard.health import HEALTHY, Deferred, Healthy, Lost, Verdict, judge
from sandboxctl.guard.pods import PodView
from sandboxctl.lifecycle import Background, Loop

log = logging.getLogger(__name__)

PLACEHOLDERS = frozenset({"name", "namespace", "ip", "node", "uid"})
OnVerdict = Callable[[PodView, Verdict], None]


def check_template(template: str) -> str:
    """The template, or ConfigurationError naming what it cannot fill."""
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as error:
        raise ConfigurationError(f"--busy-source probe={template}: {error}") from None
    unknown = sorted(fields - PLACEHOLDERS)
    if unknown or "" in fields:
        raise ConfigurationError(
            f"--busy-source probe={template}: unknown placeholder {{{(unknown or [''])[0]}}}; "
            f"use {', '.join('{' + p + '}' for p in sorted(PLACEHOLDERS))}"
        )
    if not template.startswith(("http://", "https://")):
        raise ConfigurationError(f"--busy-source probe={template}: expected an http(s) URL")
    return template


@dataclass
class ProbeState:
    failures: int = 0
    busy: bool | None = None  # the last answer; None before the first
    verdict: Verdict = HEALTHY
    detail: str = "not probed yet"


class ProbeSource:
    def __init__(
        self,
        template: str,
        pods: Callable[[], Sequence[PodView]],
        *,
        interval: float,
        timeout: float,
        threshold: int,
        slack: timedelta,
        concurrency: int = 16,
        clock: Clock | None = None,
        on_verdict: OnVerdict | None = None,
        client: httpx.Client | None = None,
    ) -> None:
        self.name = f"probe={template}"
        self.template = check_template(template)
        self._pods = pods
        self.interval = interval
        self.threshold = threshold
        self.slack = slack
        self._clock = clock or SystemClock()
        self._on_verdict = on_verdict
        self._client = client or httpx.Client(
            timeout=timeout, limits=httpx.Limits(max_connections=concurrency)
        )
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="guard-probe")
        self._states: dict[str, ProbeState] = {}
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._background = Background(
            Loop(
                "guard-probe",
                self._round,
                timedelta(seconds=interval),
                from_end=True,  # a full interval after each round, however long it took
                logger=log,
            )
        )
        self._changed: Changed = ignore_change
        self.rounds = 0

    def start(self, changed: Changed) -> None:
        self._changed = changed
        self._background.start()

    def stop(self) -> None:
        self._background.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._client.close()

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    # --- readings -------------------------------------------------------------------------

    def reading(self, pod: PodView) -> Busy:
        state = self._states.get(pod.uid)
        if state is None or state.busy is None:
            return Busy.UNKNOWN
        if isinstance(state.verdict, Lost):
            return Busy.IDLE
        return Busy.BUSY if state.busy else Busy.IDLE

    def detail(self, pod: PodView) -> str:
        state = self._states.get(pod.uid)
        return state.detail if state is not None else "not probed yet"

    def verdict(self, uid: str) -> Verdict:
        state = self._states.get(uid)
        return state.verdict if state is not None else HEALTHY

    # --- the loop -------------------------------------------------------------------------

    def _round(self) -> None:
        if self.probe_round():
            self._changed()

    def probe_round(self) -> bool:
        """Probe every pod once and judge the failing ones; True when a reading changed."""
        pods = list(self._pods())
        answers = list(self._pool.map(self._probe, pods))
        now = self._clock.now()
        changed = False
        with self._lock:
            seen = set()
            for pod, answer in zip(pods, answers, strict=True):
                seen.add(pod.uid)
                state = self._states.setdefault(pod.uid, ProbeState())
                before = self._reading_of(state)
                old_verdict = state.verdict
                if answer is None:
                    continue  # nothing to probe yet (no address): no failure either
                ok, busy, detail = answer
                if ok:
                    state.failures, state.busy, state.detail = 0, busy, detail
                    state.verdict = HEALTHY
                else:
                    state.failures += 1
                    state.detail = f"{detail} ({state.failures} failed in a row)"
                    state.verdict = judge(
                        pod, bool(state.busy), state.failures, now, self.threshold, self.slack
                    )
                if state.verdict != old_verdict:
                    self._report(pod, state.verdict)
                changed = changed or self._reading_of(state) != before
            for uid in [uid for uid in self._states if uid not in seen]:
                del self._states[uid]  # left the cache: forgotten, not lost
        self.rounds += 1
        self._synced.set()
        return changed

    def _probe(self, pod: PodView) -> tuple[bool, bool, str] | None:
        fields = {
            "name": pod.name,
            "namespace": pod.namespace,
            "ip": pod.ip,
            "node": pod.node,
            "uid": pod.uid,
        }
        if "{ip}" in self.template and not pod.ip:
            return None
        url = self.template.format(**fields)
        try:
            response = self._client.get(url)
            response.raise_for_status()
            answer = response.json()
            if not isinstance(answer, dict):
                raise ValueError("expected a JSON object")
            queries = answer.get("queries", 0)
            busy = bool(answer.get("busy")) or (isinstance(queries, int) and queries > 0)
        except (httpx.HTTPError, ValueError) as error:
            return False, False, " ".join(f"probe failed: {type(error).__name__}: {error}".split())
        return True, busy, f"busy={str(busy).lower()} queries={queries}"

    @staticmethod
    def _reading_of(state: ProbeState) -> tuple[bool | None, bool]:
        return (state.busy, isinstance(state.verdict, Lost))

    def _report(self, pod: PodView, verdict: Verdict) -> None:
        where = f"{pod.namespace}/{pod.name}"
        if isinstance(verdict, Deferred):
            log.warning(
                "event=drain-deferred pod=%s uid=%s deadline=%s (busy and Terminating: "
                "not declared lost before its deadline)",
                where, pod.uid, verdict.deadline.isoformat(),
            )  # fmt: skip
        elif isinstance(verdict, Lost):
            log.warning("event=worker-lost pod=%s uid=%s reason=%s", where, pod.uid, verdict.reason)
        elif isinstance(verdict, Healthy):
            log.info("event=worker-healthy pod=%s uid=%s", where, pod.uid)
        if self._on_verdict is not None:
            self._on_verdict(pod, verdict)

"""Readiness: wait, off the serving thread, until every part of the fleet answers and the
warm pools are full, then print the ``ready:`` line scripts wait for."""

from __future__ import annotations

import logging
import ssl
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from sandboxctl.core.errors import SandboxctlError
from sandboxctl.inventory.mesh import MeshInventorySource
from sandboxctl.lifecycle import Stop
from sandboxctl.sandboxd.agent import Agent
from sandboxctl.store import SandboxStore

if TYPE_CHECKING:
    from sandboxctl.fleet.run import Fleet

log = logging.getLogger("sandboxctl.serve")

READY_TIMEOUT = 120.0  # seconds for every part to answer and the warm pools to fill
CHECK_TIMEOUT = 2.0  # seconds per readiness request


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


Checks = dict[str, Callable[[], str | None]]


class Readiness:
    """Waits, off the serving thread, until every part answers; then says ``ready:``.
    A part of the fleet's process manager: it checks once and then waits for the stop."""

    name = "readiness"

    def __init__(
        self,
        fleet: Fleet,
        agent: Agent,
        store: SandboxStore,
        inventories: MeshInventorySource,
        root_token: str,
        kube_ca: Path,
        timeout: float = READY_TIMEOUT,
    ) -> None:
        self.fleet = fleet
        self.agent = agent
        self.store = store
        self.inventories = inventories
        self.root_token = root_token
        self.stopping = Stop()  # the run's
        self.kube_ca = kube_ca  # the Sandbox API serves HTTPS with this certificate
        self.timeout = timeout

    def run(self, stop: Stop) -> None:
        self.stopping = stop
        self.check()
        stop.wait()

    def check(self) -> None:
        deadline = time.monotonic() + self.timeout
        try:
            trust = ssl.create_default_context(cafile=str(self.kube_ca))
            with httpx.Client(timeout=CHECK_TIMEOUT, verify=trust) as http:
                # The agent first: the inventory starts as soon as it answers, so the
                # APIs see the node even if another part never answers.
                agent, apis = self._http_checks(http)
                if not self._wait_http(agent, deadline) or not self._start_inventory():
                    return
                if not self._wait_http(apis, deadline):
                    return
            if not self._wait(deadline, "the mesh inventory to list the node", self._node_listed):
                return
            pools = self._wait(deadline, "", self._pools_full, report=False)
        except Exception:  # never let a readiness bug take anything down
            log.exception("readiness check failed")
            return
        if self.stopping.is_set():
            return
        summary = self._pool_summary()
        if not pools:
            log.warning(
                "warm pools did not reach their target within %.0fs (%s); claims start "
                "sandboxes cold meanwhile",
                self.timeout,
                summary,
            )
        ports = self.fleet.ports
        parts = [
            f"e2b API {self.fleet.url(ports.e2b)}",
            f"envd proxy {self.fleet.url(ports.proxy)}",
            f"Kubernetes API {self.fleet.kube_url}",
            f"sandboxd {self.fleet.url(ports.sandboxd)} (node {self.agent.settings.node})",
            f"warm pools {summary}" if summary else "no warm pools",
        ]
        say("ready: " + ", ".join(part for part in parts if part))

    def _http_checks(self, http: httpx.Client) -> tuple[Checks, Checks]:
        """(the agent's check, the APIs' checks): each None when it answers, else why not."""
        ports = self.fleet.ports
        auth = {"Authorization": f"Bearer {self.root_token}"}
        agent: Checks = {
            "sandboxd (GET /v1/info)": lambda: _answers(
                http, f"{self.fleet.url(ports.sandboxd)}/v1/info", auth
            ),
        }
        apis: Checks = {
            "the Kubernetes API (GET /readyz)": lambda: _answers(
                http, f"{self.fleet.kube_url}/readyz"
            ),
            "the e2b API (GET /health)": lambda: _answers(
                http, f"{self.fleet.url(ports.e2b)}/health"
            ),
            "the envd proxy (GET /healthz)": lambda: _answers(
                http, f"{self.fleet.url(ports.proxy)}/healthz"
            ),
        }
        return agent, apis

    def _wait_http(self, checks: Checks, deadline: float) -> bool:
        pending = dict(checks)
        reasons: dict[str, str] = {}
        while pending:
            for name, check in list(pending.items()):
                reason = check()
                if reason is None:
                    del pending[name]
                else:
                    reasons[name] = reason
            if not pending:
                return True
            if self.stopping.is_set():
                return False
            if time.monotonic() > deadline:
                for name in pending:
                    log.error(
                        "not ready: %s did not answer within %.0fs: %s",
                        name,
                        self.timeout,
                        reasons[name],
                    )
                return False
            self.stopping.wait(0.05)
        return True

    def _start_inventory(self) -> bool:
        if self.stopping.is_set():
            return False
        try:
            self.inventories.start()  # polls the agent once, then every second
        except (SandboxctlError, RuntimeError) as error:
            if not self.stopping.is_set():
                log.error("not ready: the mesh inventory cannot read the agent: %s", error)
            return False
        return True

    def _wait(
        self, deadline: float, what: str, check: Callable[[], bool], report: bool = True
    ) -> bool:
        while not check():
            if self.stopping.is_set():
                return False
            if time.monotonic() > deadline:
                if report:
                    log.error("not ready: timed out after %.0fs waiting for %s", self.timeout, what)
                return False
            self.stopping.wait(0.05)
        return True

    def _node_listed(self) -> bool:
        return self.agent.settings.node in self.store.fresh_nodes()

    def _pools_full(self) -> bool:
        return all(p.warm >= p.target for p in self.agent.info().pools)

    def _pool_summary(self) -> str:
        return ", ".join(f"{p.key} {p.warm}/{p.target}" for p in self.agent.info().pools)


def _answers(http: httpx.Client, url: str, headers: Mapping[str, str] | None = None) -> str | None:
    """None when ``url`` answers below 400, else why not (one line)."""
    try:
        response = http.get(url, headers=headers)
    except httpx.HTTPError as error:
        return str(error) or type(error).__name__
    if response.status_code >= 400:
        return f"{response.status_code} {response.text.strip()[:200]}"
    return None

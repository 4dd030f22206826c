"""The fleet a lane acts on, as the lanes see it: endpoints to read, faults to inject, and
facts to count. ``local.py`` builds one on this machine; ``external.py`` drives an
operator's deployment through the commands named in a file. Lanes know nothing else of a
kit, so every lane runs on both unless its ``kits`` say otherwise."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx

from sandboxctl.agentapi import AgentClient
from sandboxctl.lanes.model import Progress, Windows


@dataclass(frozen=True)
class Host:
    """One host of the kit: its node name (the NodeInventory's) and its agent's URL."""

    label: str  # "A" or "B", as docs/lanes.md's lane tables name them
    node: str
    agent_url: str


@dataclass(frozen=True)
class Replica:
    """One API server replica: its Sandbox API and its e2b API."""

    name: str
    kube_url: str
    e2b_url: str


class Kit(Protocol):
    name: str
    windows: Windows
    a: Host  # the host that stays up
    b: Host  # the host the faults hit
    replicas: tuple[Replica, ...]  # replicas[0] is meant to hold the warm-pool Lease
    proxy_url: str
    domain: str  # the envd proxy's domain: <port>-<sandbox id>.<domain>
    kubeconfig: Path  # the control plane's
    warm_pool: str  # the SandboxWarmPool the kit runs ("namespace/name")
    template: str  # what lanes claim fresh sandboxes of, on a chosen host (the pool's)
    # What the control plane is, for the report: "kube-apiserver v1.35.4 + etcd 3.6.5", "the
    # Kubernetes API double (...)"; "" when the kit cannot tell.
    control_plane_name: str

    # --- clients (authenticated, TLS as the kit needs) -------------------------------------

    def e2b(self, replica: Replica) -> httpx.Client:
        """A client for one replica's e2b API (base URL and API key set)."""
        ...

    def kube(self, replica: Replica) -> httpx.Client:
        """A client for one replica's Sandbox API (base URL and bearer token set)."""
        ...

    def proxy(self) -> httpx.Client:
        """A client for the envd proxy (base URL set; requests name the sandbox in Host)."""
        ...

    def agent(self, host: Host) -> AgentClient:
        """The fleet's client for one host's agent (claims on a chosen host, metrics)."""
        ...

    # --- faults ----------------------------------------------------------------------------

    def kill_host(self, host: Host) -> None:
        """kill -9 the host's agent and its publisher (their sandboxes keep running)."""
        ...

    def start_host(self, host: Host) -> None:
        """Start the host's agent (adopting the sandboxes it kept) and its publisher."""
        ...

    def stop_publisher(self, host: Host) -> None:
        """Stop the host's publisher only (SIGTERM); the agent keeps running."""
        ...

    def start_publisher(self, host: Host, stamp: bool = True) -> None:
        """Start the host's publisher; ``stamp=False`` runs it as an old publisher that
        never writes ``publishedAt`` (``publish --no-stamp``)."""
        ...

    def stop_control_plane(self) -> None:
        """Stop the Kubernetes API server (a control-plane outage)."""
        ...

    def start_control_plane(self) -> None:
        """Start it again, with the state it had."""
        ...

    # --- facts -----------------------------------------------------------------------------

    def replica_log(self, replica: Replica) -> str:
        """Everything the replica has logged so far (its stdout and stderr), so that a
        lane can read the lines it wrote meanwhile (K1B2-01: none naming B; K1OUT-01:
        replicas[0] leads before the outage)."""
        ...

    def packets_to_agent(self, host: Host) -> int:
        """Packets sent toward the host's agent address so far, counted outside the
        agent (a dead agent counts too)."""
        ...

    # --- lifecycle -------------------------------------------------------------------------

    def heal(self, progress: Progress) -> None:
        """Bring every part back as built (agents, stamping publishers, control plane,
        replicas, proxy) and wait until every replica lists both hosts fresh and the warm
        pool is full. The runner calls it between scenarios."""
        ...

    def describe(self) -> str:
        """How to reach the kit by hand (``--keep``): endpoints, credentials' files, logs."""
        ...

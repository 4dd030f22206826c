"""Reads of a live fleet, each made once: the agents asked for their inventories (mesh),
or the NodeInventory objects listed (kube). Mesh mode's poller asks each agent through
:func:`read_agent` and judges its first round with :func:`check_answers`; the operator
verbs (``inventory --source mesh|kube``, ``status``) make one read and exit.

A read that no retry can mend (a token refused, an answer that breaks the API, an API
server without NodeInventory) fails in one line naming the place; an agent that does not
answer is data (:class:`PollResult`), which each caller judges.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import httpx  # loaded by the agent API's client in any case

from sandboxctl.agentapi.errors import AgentAnswerError, AgentError, AgentUnreachable
from sandboxctl.agentapi.mapping import ADVERTISE_FIELD, inventory_from_agent
from sandboxctl.clock import Clock, SystemClock
from sandboxctl.core.errors import ConfigurationError, InventoryFormatError, SandboxctlError
from sandboxctl.core.model import NodeInventory, inventory_from_object
from sandboxctl.core.names import NODE_INVENTORIES, SANDBOXES

if TYPE_CHECKING:  # the Kubernetes client loads only for a kube read (about a second)
    from kubernetes.client import ApiClient

    from sandboxctl.agentapi.models import AgentInfo, SandboxRow

READ_TIMEOUT = 5.0  # seconds for each request of a one-shot read


class MeshStartError(SandboxctlError):
    """The agents cannot be read: none answered, one refused the token, or one is
    misconfigured (mesh mode cannot start; a one-shot read fails). One line, naming the
    seed."""


class AgentReads(Protocol):
    """The reads mesh mode needs from one agent."""

    def info(self) -> AgentInfo: ...

    def sandboxes(self) -> Sequence[SandboxRow]: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class PollResult:
    """What one agent did when asked: ``node`` when it answered, else ``reason``."""

    address: str
    node: str = ""
    reason: str = ""
    status: int | None = None  # the HTTP status of a refusal
    error: Exception | None = field(default=None, compare=False, repr=False)
    slow: bool = False  # still busy when the tick ended (its answer is taken when it comes)

    @property
    def ok(self) -> bool:
        return bool(self.node)

    @property
    def waiting(self) -> bool:
        """No answer yet: still busy when its tick ended, or its request timed out (a
        seed that is only slow, which start gives time)."""
        return self.slow or (isinstance(self.error, AgentUnreachable) and self.error.timed_out)


def read_agent(
    client: AgentReads, address: str, clock: Clock
) -> tuple[PollResult, NodeInventory | None]:
    """Ask one agent for its info and sandboxes: its inventory, stamped with ``clock``
    when the answers came, or the failure (never raised: one node's failure is data)."""
    try:
        info = client.info()
        rows = client.sandboxes()
        inventory = inventory_from_agent(info, rows, published_at=clock.now())
    except Exception as error:
        if isinstance(error, AgentAnswerError) and not error.address:
            error = error.at(address)
        status = error.status if isinstance(error, AgentError) else None
        return PollResult(address, reason=describe(error), status=status, error=error), None
    return PollResult(address, node=inventory.node), inventory


def check_answers(
    results: Sequence[PollResult], need_an_answer: bool = True, one_shot: bool = False
) -> None:
    """Raise :class:`MeshStartError` for a setup that cannot work: a seed refused the
    token or gave an answer that cannot be read; with ``need_an_answer``, also when no
    seed answered at all. ``one_shot``: worded for a read made once (``inventory --source
    mesh``, ``status``), not for mesh mode's start."""
    reader = "reading the agents" if one_shot else "mesh mode"
    for result in results:
        if result.status == 401:
            raise MeshStartError(
                f"sandboxd seed {result.address} refused the token: {reader} needs the "
                "fleet's root token (--sandboxd-token-file)"
            )
    for result in results:
        error = result.error
        if isinstance(error, AgentAnswerError):
            if error.field == ADVERTISE_FIELD:
                raise MeshStartError(
                    f"sandboxd seed {result.address} reports no advertise_addr, the node's "
                    "address (start the agent with --advertise-addr)"
                    if one_shot
                    else f"sandboxd seed {result.address} reports no advertise_addr: mesh "
                    "mode publishes it as the node's address (start the agent with "
                    "--advertise-addr)"
                )
            raise MeshStartError(
                f"sandboxd seed {result.address} gave an answer {reader} cannot read: "
                f"{error.field}: {error.problem}"
            )
    if need_an_answer and not any(result.ok for result in results):
        failed = ", ".join(f"{r.address} ({r.reason})" for r in results)
        raise MeshStartError(f"no sandboxd seed answered: {failed}")


def describe(error: BaseException) -> str:
    """A short, one-line reason for a failed read of an agent."""
    if isinstance(error, AgentAnswerError):
        text = f"{error.field}: {error.problem}" if error.field else error.problem
    elif isinstance(error, AgentUnreachable):
        text = error.reason
    elif isinstance(error, AgentError) and error.status == 401:
        text = "refused the token (401)"
    elif isinstance(error, AgentError):
        text = f"{error.status} {error.message}"
    else:
        text = f"{type(error).__name__}: {error}"
    return " ".join(text.split())


# --- one read of every agent ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AgentsRead:
    """One read of the seeds: the inventories of those that answered, and every result
    (in seed order)."""

    inventories: tuple[NodeInventory, ...]
    results: tuple[PollResult, ...]

    @property
    def failed(self) -> tuple[PollResult, ...]:
        return tuple(result for result in self.results if not result.ok)


def read_agents(
    seeds: Sequence[str],
    token: str | None,
    timeout: float = READ_TIMEOUT,
    clock: Clock | None = None,
) -> AgentsRead:
    """Ask every seed once, all at once (each request within ``timeout``). Nothing is
    judged: the caller passes the results to :func:`check_answers`, or its own rule."""
    from sandboxctl.agentapi.client import AgentClient  # httpx: only when a read is made

    if not seeds:
        raise ConfigurationError("--sandboxd-seeds: no agent address (HOST:PORT,...)")
    now = clock or SystemClock()

    def ask(address: str) -> tuple[PollResult, NodeInventory | None]:
        with AgentClient(address, token, timeout=timeout, transport=transport(address)) as client:
            return read_agent(client, address, now)

    if len(seeds) == 1:  # no pool for the one agent of a serve fleet
        answers = [ask(seeds[0])]
    else:
        with ThreadPoolExecutor(len(seeds), thread_name_prefix="sandboxctl-read") as pool:
            answers = list(pool.map(ask, seeds))
    results = tuple(result for result, _ in answers)
    inventories = tuple(inventory for _, inventory in answers if inventory is not None)
    return AgentsRead(inventories, results)


def transport(url: str, trust: ssl.SSLContext | None = None) -> httpx.HTTPTransport:
    """httpx's own transport for a read made once, its TLS context loaded only for an
    HTTPS ``url``: httpx's default reads the whole CA bundle for every client, a tenth
    of a verb's start, which a plain-HTTP read (an agent, serve's APIs) never uses.
    ``trust``: what to trust over HTTPS (default: what httpx trusts)."""
    if url.startswith("https://"):
        return httpx.HTTPTransport(verify=trust or _default_trust())
    return httpx.HTTPTransport(verify=_no_certificates())


@cache
def _default_trust() -> ssl.SSLContext:
    return httpx.create_ssl_context()  # the CA bundle, read once per process


@cache
def _no_certificates() -> ssl.SSLContext:
    """For plain HTTP: no certificate loaded, so a redirect to HTTPS fails verification
    rather than trusting anything."""
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


# --- one list of the NodeInventory objects -------------------------------------------------


def list_node_inventories(kubeconfig: Path | None) -> tuple[list[NodeInventory], str]:
    """Every NodeInventory object of the cluster ``kubeconfig`` names (its default
    otherwise), and that API server's URL. An API server without the resource is one line
    saying which kind of server it is: serve's Sandbox API, or one without the CRD."""
    from sandboxctl.kube import CustomObjects, KubeNotFound, api_client

    api = api_client(kubeconfig)
    server = str(api.configuration.host)
    try:
        try:
            listed = CustomObjects(api, NODE_INVENTORIES).list()
        except KubeNotFound:
            # Not the 404 alone: what this server is, and where NodeInventory lives.
            raise ConfigurationError(_not_served(api, server, kubeconfig)) from None
    finally:
        api.close()  # type: ignore[no-untyped-call]
    inventories = []
    for obj in listed.items:
        name = (obj.get("metadata") or {}).get("name", "?")
        try:
            inventories.append(inventory_from_object(obj))
        except InventoryFormatError as error:
            raise error.located(f"NodeInventory {name}") from None
    return inventories, server


def _not_served(api: ApiClient, server: str, kubeconfig: Path | None) -> str:
    """Why ``server`` has no NodeInventory: the Sandbox API (``serve``'s, or
    ``serve-apiserver``'s) serves Sandboxes only; any other lacks the CRD."""
    where = f"--kubeconfig {kubeconfig}" if kubeconfig is not None else "the kubeconfig"
    resource = f"{NODE_INVENTORIES.plural}.{NODE_INVENTORIES.group}"
    if SANDBOXES.plural in _served_plurals(api, SANDBOXES.group, SANDBOXES.version):
        return (
            f"{where} reaches {server}, a sandboxctl Sandbox API (as the kubeconfig serve "
            f"writes in its state dir does): it serves Sandboxes only, not {resource}, "
            "which live on a real Kubernetes API where each host publishes its own "
            "(sandboxctl publish); read a serve fleet with `sandboxctl status`, or its "
            "agents with `sandboxctl inventory --source mesh`"
        )
    return (
        f"{where} reaches {server}, which does not serve {resource}: is the CRD installed "
        "(kubectl apply -f manifests/crds)?"
    )


def _served_plurals(api: ApiClient, group: str, version: str) -> set[str]:
    """The resources the server lists for one group version (none when it answers no
    list: the question is only asked to explain a failure)."""
    from kubernetes.client import CustomObjectsApi

    try:
        listed = CustomObjectsApi(api).get_api_resources(
            group, version, _request_timeout=READ_TIMEOUT
        )
    except Exception:  # any failure: explain without it
        return set()
    return {str(resource.name) for resource in listed.resources or ()}

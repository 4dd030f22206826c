"""The one httpx client every component uses to reach a host agent.

Each verb sends a model's JSON and reads the answer back into a model; every failure is
one of :mod:`sandboxctl.agentapi.errors`, with the httpx error chained: an error status is
:class:`AgentError`, no answer is :class:`AgentUnreachable`, an answer that breaks the API
is :class:`AgentAnswerError`. An id is checked and escaped before it goes in a URL
(:mod:`sandboxctl.agentapi.ids`), so a bad one costs no request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import httpx
from msgspec import UNSET

from sandboxctl.agentapi.errors import (
    AgentAnswerError,
    AgentError,
    AgentUnreachable,
    InvalidId,
)
from sandboxctl.agentapi.ids import id_problem, sandbox_path
from sandboxctl.agentapi.models import (
    AgentInfo,
    ClaimGrant,
    ClaimRequest,
    PoolsUpdate,
    PoolTarget,
    RenewAnswer,
    RenewRequest,
    SandboxList,
    SandboxLog,
    SandboxRow,
    UsageSample,
    UsageSamples,
)
from sandboxctl.agentapi.network import NetworkUpdate
from sandboxctl.core import wire
from sandboxctl.core.wire import Model

T = TypeVar("T", bound=Model)
DEFAULT_TIMEOUT = 10.0
# Failures before any byte of the request left: a claim that met one certainly did not land.
_BEFORE_SENDING = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


class AgentClient:
    """One agent, over one pooled httpx client; thread-safe. ``token`` (the fleet's root
    token, or a sandbox's own) goes with every call; ``transport`` replaces the network in
    tests."""

    def __init__(
        self,
        address: str,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        base = address if "://" in address else f"http://{address}"
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.address = address
        self._http = httpx.Client(
            base_url=base, headers=headers, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- reads ---------------------------------------------------------------------------

    def info(self) -> AgentInfo:
        return self._read(AgentInfo, "GET", "/v1/info", "info")

    def sandboxes(self, claim_ref: str | None = None) -> list[SandboxRow]:
        """Every claimed sandbox, or those whose ``claim_ref`` is exactly ``claim_ref``."""
        params = {"claim_ref": claim_ref} if claim_ref is not None else None
        return list(
            self._read(SandboxList, "GET", "/v1/sandboxes", "sandboxes", params=params).sandboxes
        )

    def get(self, sandbox_id: str) -> SandboxRow:
        """One claimed sandbox, with its token."""
        return self._read(SandboxRow, "GET", self._path(sandbox_id), "sandbox")

    def metrics(self) -> str:
        return self._send("GET", "/metrics").text

    def usage(
        self,
        sandbox_id: str,
        start: float | None = None,
        end: float | None = None,
        latest: bool = False,
    ) -> list[UsageSample]:
        """A claimed sandbox's usage samples between ``start`` and ``end`` (unix seconds,
        either end open), oldest first; with ``latest`` only the newest of them."""
        given = (("start", start), ("end", end), ("latest", "true" if latest else None))
        params = {k: v for k, v in given if v is not None}
        path = self._path(sandbox_id, "metrics")
        return list(self._read(UsageSamples, "GET", path, "metrics", params=params or None).samples)

    def log(self, sandbox_id: str) -> SandboxLog:
        """A sandbox's log, also after it was destroyed while the agent keeps it."""
        return self._read(SandboxLog, "GET", self._path(sandbox_id, "logs"), "logs")

    # --- verbs ---------------------------------------------------------------------------

    def claim(self, request: ClaimRequest) -> ClaimGrant:
        return self._read(ClaimGrant, "POST", "/v1/claim", "claim", body=request)

    def release(self, sandbox_id: str, token: str | None = None) -> None:
        """Destroy the sandbox; ``token`` (its own) replaces the client's for this call."""
        self._send("POST", self._path(sandbox_id, "release"), token=token)

    def renew(self, sandbox_id: str, ttl_seconds: int, on_expire: str | None = None) -> RenewAnswer:
        body = RenewRequest(ttl_seconds, UNSET if on_expire is None else on_expire)
        return self._read(RenewAnswer, "POST", self._path(sandbox_id, "renew"), "renew", body=body)

    def hibernate(self, sandbox_id: str) -> None:
        self._send("POST", self._path(sandbox_id, "hibernate"))

    def wake(self, sandbox_id: str) -> None:
        self._send("POST", self._path(sandbox_id, "wake"))

    def set_network(self, sandbox_id: str, update: NetworkUpdate) -> None:
        """Replace a claimed sandbox's egress rules (``PUT .../network``)."""
        self._send("PUT", self._path(sandbox_id, "network"), body=update)

    def set_pools(self, pools: Sequence[PoolTarget]) -> AgentInfo:
        """Replace every warm target; the answer is the agent's info after the change."""
        return self._read(AgentInfo, "PUT", "/v1/pools", "pools", body=PoolsUpdate(tuple(pools)))

    # --- one request ---------------------------------------------------------------------

    def _path(self, sandbox_id: str, verb: str = "") -> str:
        problem = id_problem(sandbox_id)
        if problem is not None:
            raise InvalidId(sandbox_id, problem, self.address)
        return sandbox_path(sandbox_id, verb)

    def _read(self, model: type[T], method: str, path: str, what: str, **kwargs: Any) -> T:
        """The answer as ``model``; an answer that does not fit names this agent, and
        ``what`` (the answer's name in its fields) when it is not JSON at all."""
        response = self._send(method, path, **kwargs)
        try:
            return wire.decode(model, response.content, root=model.ROOT)
        except wire.NotJson as error:
            raise AgentAnswerError(what, "the answer is not JSON", self.address) from error
        except wire.WireError as error:
            raise AgentAnswerError(error.field, error.problem, self.address) from None

    def _send(
        self,
        method: str,
        path: str,
        token: str | None = None,
        body: Model | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if body is not None:
            kwargs["content"] = wire.encode(body)
            headers["Content-Type"] = "application/json"
        try:
            response = self._http.request(method, path, headers=headers or None, **kwargs)
        except httpx.TransportError as error:
            raise unreachable(self.address, error) from error
        except httpx.HTTPError as error:  # an answer httpx could not decode
            raise AgentAnswerError("", str(error) or type(error).__name__, self.address) from error
        if response.status_code >= 400:
            raise AgentError(response.status_code, _message(response), self.address)
        return response


def unreachable(address: str, error: httpx.TransportError) -> AgentUnreachable:
    """The transport error as :class:`AgentUnreachable`, with a reason short enough for
    one log line."""
    if isinstance(error, httpx.TimeoutException):
        reason = "timed out"
    elif isinstance(error, httpx.ConnectError) and _refused(error):
        reason = "connection refused"
    else:
        reason = " ".join((str(error) or type(error).__name__).split())
    return AgentUnreachable(
        address,
        reason,
        undelivered=isinstance(error, _BEFORE_SENDING),
        timed_out=isinstance(error, httpx.TimeoutException),
    )


def _refused(error: BaseException) -> bool:
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    return "connection refused" in str(error).lower()


def _message(response: httpx.Response) -> str:
    """The agent's ``{"error": ...}`` text, else the body as it came."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()
    if isinstance(body, dict) and "error" in body:
        return str(body["error"]).strip()
    return response.text.strip()

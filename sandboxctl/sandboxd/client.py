"""The httpx client every other component uses to reach a host agent."""

from __future__ import annotations

from typing import Any

import httpx

from sandboxctl.core.errors import SandboxctlError


class SandboxdError(SandboxctlError):
    """The agent answered with an error status; ``status`` and its message are kept."""

    def __init__(self, status: int, message: str, address: str) -> None:
        self.status = status
        self.message = message
        self.address = address
        super().__init__(f"sandboxd {address}: {status} {message}")


class SandboxdClient:
    def __init__(
        self,
        address: str,
        token: str | None = None,
        timeout: float = 10.0,
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

    def __enter__(self) -> SandboxdClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def info(self) -> dict[str, Any]:
        return self._json("GET", "/v1/info")

    def sandboxes(self, claim_ref: str | None = None) -> list[dict[str, Any]]:
        params = {"claim_ref": claim_ref} if claim_ref is not None else None
        rows: list[dict[str, Any]] = self._json("GET", "/v1/sandboxes", params=params)["sandboxes"]
        return rows

    def get(self, sandbox_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/sandboxes/{sandbox_id}")

    def claim(self, template: str, **fields: Any) -> dict[str, Any]:
        return self._json("POST", "/v1/claim", json={"template": template, **fields})

    def release(self, sandbox_id: str, token: str | None = None) -> None:
        self._call("POST", f"/v1/sandboxes/{sandbox_id}/release", token=token)

    def renew(self, sandbox_id: str, ttl_seconds: int, **fields: Any) -> dict[str, Any]:
        body = {"ttl_seconds": ttl_seconds, **fields}
        return self._json("POST", f"/v1/sandboxes/{sandbox_id}/renew", json=body)

    def hibernate(self, sandbox_id: str) -> None:
        self._call("POST", f"/v1/sandboxes/{sandbox_id}/hibernate")

    def wake(self, sandbox_id: str) -> None:
        self._call("POST", f"/v1/sandboxes/{sandbox_id}/wake")

    def set_pools(self, pools: list[dict[str, Any]]) -> dict[str, Any]:
        return self._json("PUT", "/v1/pools", json={"pools": pools})

    def metrics(self) -> str:
        return self._call("GET", "/metrics").text

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        body: dict[str, Any] = self._call(method, path, **kwargs).json()
        return body

    def _call(
        self, method: str, path: str, token: str | None = None, **kwargs: Any
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        response = self._http.request(method, path, headers=headers, **kwargs)
        if response.status_code >= 400:
            try:
                message = str(response.json().get("error", response.text))
            except ValueError:
                message = response.text
            raise SandboxdError(response.status_code, message, self.address)
        return response

"""The envd proxy's own ``/metrics`` and ``/healthz``: request latency by the route the
proxy took, on the proxy's own host only; a sandbox's host keeps its ``/metrics`` and
``/healthz`` (the guest's)."""

from __future__ import annotations

import re

import httpx

from tests.proxy.conftest import DOMAIN, LISTED, Fleet, Headers, public

HISTOGRAM = "sandboxctl_http_request_duration_seconds"


def _counts(text: str) -> dict[str, float]:
    pattern = rf"^{HISTOGRAM}_count\{{(.*)\}} ([0-9.e+]+)$"
    return {m.group(1): float(m.group(2)) for m in re.finditer(pattern, text, re.MULTILINE)}


def test_requests_are_timed_by_the_route_taken_never_by_sandbox(
    client: httpx.Client, sdk_headers: Headers
) -> None:
    assert client.get("/health", headers=sdk_headers()).status_code == 204
    assert client.get("/anything", headers=sdk_headers(port="8080")).status_code == 404
    assert client.get("/healthz").status_code == 204
    assert client.get("/nothing").status_code == 400  # names no sandbox

    text = client.get("/metrics").text
    counts = _counts(text)
    label = 'method="GET",route="{}",service="proxy",status="{}"'
    assert counts[label.format("envd", 204)] == 1
    assert counts[label.format("guest port", 404)] == 1
    assert counts[label.format("/healthz", 204)] == 1
    assert counts[label.format("unmatched", 400)] == 1
    timed = "\n".join(line for line in text.splitlines() if line.startswith(HISTOGRAM))
    assert LISTED not in timed
    assert public(LISTED) not in timed
    assert "/anything" not in timed


def test_metrics_on_a_sandbox_host_is_the_guests_own(client: httpx.Client, fleet: Fleet) -> None:
    standin = fleet.standins["node-a"]
    host = f"8080-{public(LISTED)}.{DOMAIN}"

    response = client.get("/metrics", headers={"Host": host})

    assert standin.requests[-1] == f"GET /v1/sandboxes/{LISTED}/ports/8080/metrics"
    assert HISTOGRAM not in response.text  # relayed, not the proxy's own


def test_healthz_on_a_sandbox_host_is_the_guests_own(client: httpx.Client, fleet: Fleet) -> None:
    standin = fleet.standins["node-a"]
    host = f"8080-{public(LISTED)}.{DOMAIN}"

    response = client.get("/healthz", headers={"Host": host})

    assert standin.requests[-1] == f"GET /v1/sandboxes/{LISTED}/ports/8080/healthz"
    # the stand-in agent's answer, not the proxy's 204
    assert (response.status_code, response.json()) == (404, {"error": "not found"})


def test_healthz_by_sandbox_headers_is_the_guests_own(
    client: httpx.Client, fleet: Fleet, sdk_headers: Headers
) -> None:
    standin = fleet.standins["node-a"]

    response = client.get("/healthz", headers=sdk_headers(port="8080"))

    assert response.status_code == 404  # the stand-in agent's answer, not the proxy's 204
    assert standin.requests[-1] == f"GET /v1/sandboxes/{LISTED}/ports/8080/healthz"


def test_another_method_on_the_proxys_own_routes_is_405(client: httpx.Client) -> None:
    refused = client.post("/metrics")
    assert refused.status_code == 405
    assert refused.headers["allow"] == "GET"
    assert refused.json() == {"code": 405, "message": "/metrics answers GET only"}
    assert client.delete("/healthz").headers["allow"] == "GET, HEAD"
    assert client.head("/healthz").status_code == 204

"""The request latency histogram every service installs (serving/metrics.py), on a small
app of its own over loopback HTTP: labels a client cannot multiply, and the metrics
listener's own app."""

from __future__ import annotations

import contextlib
import re
import socket
from collections.abc import Iterator

import httpx
import pytest
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from sandboxctl.apiserver.kube import create_kube_app
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.inventory.memory import MemoryInventorySource
from sandboxctl.serving.apps import HttpError, install_error_handlers, json_app
from sandboxctl.serving.bounds import ReadBounds
from sandboxctl.serving.metrics import (
    NAME,
    MetricsListener,
    RequestTimes,
    metrics_app,
    status_label,
    timed,
)
from sandboxctl.store import SandboxStore
from tests.apiserver.helpers import serving
from tests.sandboxd.servers import wait_until


def _counts(text: str) -> dict[str, float]:
    pattern = rf"^{NAME}_count\{{(.*)\}} ([0-9.e+]+)$"
    return {m.group(1): float(m.group(2)) for m in re.finditer(pattern, text, re.MULTILINE)}


@pytest.fixture
def times() -> RequestTimes:
    return RequestTimes()


@pytest.fixture
def url(times: RequestTimes) -> Iterator[str]:
    app = json_app("test")

    @app.get("/items/{item_id}")
    def item(item_id: str) -> Response:
        return Response(item_id)

    @app.get("/status/{code}")
    def any_status(code: int) -> Response:  # as a guest port's server may answer
        return Response(status_code=code)

    @app.get("/boom")
    def boom() -> Response:
        raise RuntimeError("a bug")

    install_error_handlers(
        app,
        translate=lambda _, error: HttpError(500, str(error)),
        unmatched=lambda status, detail: HttpError(status, detail),
    )
    with serving(timed(app, times, "test")) as base:
        yield base


def test_series_are_by_route_template_and_a_client_cannot_add_any(
    url: str, times: RequestTimes
) -> None:
    with httpx.Client(base_url=url) as client:
        for item in ("abc", "xyz", "s3cr3t-id"):
            assert client.get(f"/items/{item}").status_code == 200
        assert client.request("PROPFIND", "/items/abc").status_code == 405
        assert client.get("/nope/123").status_code == 404
        assert client.get("/another/unknown/path").status_code == 404
        for code in (418, 418, 451):
            assert client.get(f"/status/{code}").status_code == code
        assert client.get("/boom").status_code == 500  # last: the server drops the connection

    label = 'method="{}",route="{}",service="test",status="{}"'
    # The 500 goes out before the failed request's time is recorded (the error unwinds
    # through the timing middleware after the answer): wait for it, then compare all.
    boom = label.format("GET", "/boom", 500)
    wait_until(lambda: boom in _counts(times.render().decode()), what="the 500's series")
    text = times.render().decode()
    assert _counts(text) == {
        label.format("GET", "/items/{item_id}", 200): 3,
        label.format("other", "/items/{item_id}", 405): 1,
        label.format("GET", "unmatched", 404): 2,
        label.format("GET", "/boom", 500): 1,
        label.format("GET", "/status/{code}", 418): 2,
        label.format("GET", "/status/{code}", 451): 1,
    }
    for sent in ("abc", "xyz", "s3cr3t-id", "PROPFIND", "nope", "another"):
        assert sent not in text


def test_a_status_outside_the_registered_ones_adds_no_series() -> None:
    """uvicorn sends registered statuses only today; the label does not count on it (a
    guest port's server picks its status)."""
    assert [status_label(code) for code in (200, 418, 0, 299, 432, 599)] == [
        "200", "418", "none", "other", "other", "other",
    ]  # fmt: skip


def test_without_times_the_app_is_served_as_it_is() -> None:
    app = json_app("test")
    assert timed(app, None, "test") is app


def test_the_metrics_listener_serves_metrics_and_health_only(times: RequestTimes) -> None:
    times.of("test")("/x", "GET", "200", 0.002)
    with serving(metrics_app(times)) as base:
        metrics = httpx.get(f"{base}/metrics")
        assert metrics.status_code == 200
        assert metrics.headers["content-type"].startswith("text/plain")
        assert f'{NAME}_bucket{{le="0.0025",method="GET",route="/x"' in metrics.text
        assert httpx.get(f"{base}/healthz").status_code == 204
        other = httpx.get(f"{base}/sandboxes")
        assert other.status_code == 404
        assert other.json() == {"error": "only GET /metrics and GET /healthz are served here"}


@pytest.mark.parametrize(("method", "path"), [("POST", "/metrics"), ("DELETE", "/healthz")])
def test_the_metrics_listener_refuses_another_method_with_405(
    times: RequestTimes, method: str, path: str
) -> None:
    with serving(metrics_app(times)) as base:
        refused = httpx.request(method, f"{base}{path}")
    assert refused.status_code == 405
    assert refused.headers["allow"] == "GET"
    assert refused.json() == {"error": "only GET is served on this path"}


def test_a_timed_app_reads_as_the_app_it_wraps(times: RequestTimes) -> None:
    app = json_app("test")
    app.state.marker = "mine"
    wrapped = timed(app, times, "test")
    assert wrapped is not app
    assert wrapped.state.marker == "mine"
    assert wrapped.routes == app.routes


def test_the_sandbox_apis_front_is_timed_with_it(times: RequestTimes) -> None:
    """Aggregated mode's authentication stands in front of the Sandbox API: its time,
    and its refusals, are the request's."""

    def front(app: ASGIApp) -> ASGIApp:
        async def refusing(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["path"] == "/readyz":
                await app(scope, receive, send)
                return
            await JSONResponse({"reason": "Forbidden"}, 403)(scope, receive, send)

        return refusing

    store = SandboxStore(MemoryInventorySource(()), FreshnessRule())
    with serving(create_kube_app(store, None, times=times, front=front)) as base:
        assert httpx.get(f"{base}/readyz").status_code == 200
        assert httpx.get(f"{base}/api").status_code == 403

    label = 'method="GET",route="{}",service="apiserver",status="{}"'
    assert _counts(times.render().decode()) == {
        label.format("/readyz", 200): 1,
        label.format("unmatched", 403): 1,
    }


def test_without_an_address_the_metrics_listener_is_nothing() -> None:
    app = json_app("test")
    with contextlib.ExitStack() as running:
        listener = MetricsListener(None)
        assert listener.bind(running) is None
        with socket.create_server(("127.0.0.1", 0)) as sock:
            served = listener.served([(app, sock)], None, ReadBounds())
            assert served.sockets == [sock]

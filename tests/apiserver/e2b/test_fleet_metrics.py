"""The e2b API's and the Sandbox API's request latency: served by serve-apiserver on its
``--metrics-listen`` listener only, never on the e2b port a tenant's key reaches."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from sandboxctl.sandboxd.agent import Agent, AgentSettings
from sandboxctl.sandboxd.api import create_app
from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime
from tests.apiserver.helpers import serving
from tests.sandboxd.servers import (
    free_port,
    sandboxes_unavailable,
    service_process,
    wait_until,
    write_token,
)

HISTOGRAM = "sandboxctl_http_request_duration_seconds"
UNKNOWN = "sb-0123456789abcdef"


def _counts(text: str) -> dict[str, float]:
    pattern = rf"^{HISTOGRAM}_count\{{(.*)\}} ([0-9.e+]+)$"
    return {m.group(1): float(m.group(2)) for m in re.finditer(pattern, text, re.MULTILINE)}


@pytest.mark.skipif(sandboxes_unavailable() is not None, reason=str(sandboxes_unavailable()))
def test_metrics_are_on_their_own_listener_by_route_template(
    state_dir: Path, tmp_path: Path
) -> None:
    agent = Agent(AgentSettings("n1", "127.0.0.1:1", state_dir), BubblewrapRuntime())
    token = write_token(tmp_path / "token", "root-token")
    secret = write_token(tmp_path / "secret", "envd-secret")
    keys = tmp_path / "keys"
    keys.write_text("e2b_key team\n")
    kube_port, e2b_port, metrics_port = free_port(), free_port(), free_port()
    try:
        with serving(create_app(agent, "root-token")) as agent_url:
            command = [
                "serve-apiserver",
                "--sandboxd-seeds", agent_url.removeprefix("http://"),
                "--sandboxd-token-file", str(token), "--inventory-poll", "200ms",
                "--listen", f"127.0.0.1:{kube_port}",
                "--metrics-listen", f"127.0.0.1:{metrics_port}",
                "--e2b-listen", f"127.0.0.1:{e2b_port}", "--e2b-api-key-file", str(keys),
                "--e2b-domain", "example.test", "--e2b-envd-secret-file", str(secret),
                "--kube-token-file", str(write_token(tmp_path / "kube-tokens", "kube-token *")),
            ]  # fmt: skip
            e2b = f"http://127.0.0.1:{e2b_port}"
            key = {"X-API-Key": "e2b_key"}
            with service_process(command, f"{e2b}/health"):
                assert httpx.get(f"{e2b}/v2/sandboxes", headers=key).status_code == 200
                assert httpx.get(f"{e2b}/sandboxes/{UNKNOWN}", headers=key).status_code == 404
                fork = httpx.post(f"{e2b}/sandboxes/{UNKNOWN}/fork", headers=key, json={})
                assert fork.status_code == 501
                kube = f"http://127.0.0.1:{kube_port}"
                assert httpx.get(f"{kube}/readyz").status_code == 200

                # A tenant's key reads nothing of the fleet's on the e2b port.
                tenant = httpx.get(f"{e2b}/metrics", headers=key)
                assert tenant.status_code == 404
                assert tenant.json()["code"] == 404
                assert HISTOGRAM not in tenant.text

                metrics = f"http://127.0.0.1:{metrics_port}/metrics"
                wait_until(lambda: "/readyz" in httpx.get(metrics).text, what="the last one")
                text = httpx.get(metrics).text
                assert httpx.get(f"http://127.0.0.1:{metrics_port}/other").status_code == 404
                posted = httpx.post(metrics)
                assert (posted.status_code, posted.headers["allow"]) == (405, "GET")
    finally:
        agent.stop(destroy=True)

    counts = _counts(text)
    label = 'method="GET",route="{}",service="{}",status="{}"'
    assert counts[label.format("/v2/sandboxes", "e2b", 200)] == 1
    assert counts[label.format("/sandboxes/{sandbox_id}", "e2b", 404)] == 1
    assert counts[label.format("unmatched", "e2b", 404)] == 1  # its /metrics: no route
    # An unserved route spells the sandbox as the served ones do: one label per path shape.
    fork = 'method="POST",route="/sandboxes/{sandbox_id}/fork",service="e2b",status="501"'
    assert counts[fork] == 1
    assert counts[label.format("/readyz", "apiserver", 200)] == 1
    assert UNKNOWN not in text

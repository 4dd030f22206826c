"""What ``serve`` shows an operator: each sandbox lifecycle event logged once (the agent
and the APIs share its process), and the APIs' request latency on the metrics port only."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fleet.fleet import Fleet, free_ports, start_fleet, stop_fleets
from tests.sandboxd.servers import free_port, sandboxes_unavailable, wait_until

pytestmark = pytest.mark.skipif(
    sandboxes_unavailable() is not None, reason=str(sandboxes_unavailable())
)

HISTOGRAM = "sandboxctl_http_request_duration_seconds"
CREATE_AND_KILL = "from e2b import Sandbox; s = Sandbox.create(); print(s.sandbox_id); s.kill()"


@pytest.fixture
def fleet(state_dir: Path, uid_base: int) -> Iterator[tuple[Fleet, int]]:
    metrics_port = free_port()
    started = start_fleet(
        state_dir / "fleet", free_ports(), uid_base, "--metrics-port", str(metrics_port)
    )
    try:
        yield started, metrics_port
    finally:
        stop_fleets([started])


def test_serve_logs_each_event_once_and_serves_the_apis_metrics_apart(
    fleet: tuple[Fleet, int],
) -> None:
    served, metrics_port = fleet
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    assert f"  metrics         {metrics}  " in served.output()
    run = subprocess.run(
        [sys.executable, "-c", CREATE_AND_KILL],
        env={**os.environ, **served.e2b_env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    sdk_id = run.stdout.strip()
    assert sdk_id.startswith("sb-")

    def lines() -> list[str]:
        return re.findall(rf"INFO (sandbox {re.escape(sdk_id)} .*)", served.output())

    wait_until(lambda: any(line.endswith(" killed") for line in lines()), what="the kill")
    said = lines()
    assert said[0] == f"sandbox {sdk_id} created (warm, template default)"
    assert re.fullmatch(rf"sandbox {re.escape(sdk_id)} claimed by default/\S+", said[1])
    assert said[2:] == [f"sandbox {sdk_id} killed"]

    key = {"X-API-Key": served.e2b_env["E2B_API_KEY"]}
    tenant = httpx.get(f"{served.url('e2b')}/metrics", headers=key)
    assert tenant.status_code == 404  # a tenant's key reads nothing of the fleet's
    assert HISTOGRAM not in tenant.text
    text = httpx.get(metrics).text
    assert (
        f'{HISTOGRAM}_count{{method="POST",route="/v2/sandboxes",service="e2b",status="201"}} 1.0'
    ) in text
    kill = 'method="DELETE",route="/sandboxes/{sandbox_id}",service="e2b",status="204"'
    assert f"{HISTOGRAM}_count{{{kill}}} 1.0" in text
    assert sdk_id not in text

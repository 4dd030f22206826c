"""Metrics and logs through the e2b API, with the unmodified SDK where it has a call."""

from __future__ import annotations

import json
from datetime import datetime

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxNotFoundException

from tests.apiserver.e2b.stack import KEY_A, KEY_B, Stack
from tests.sandboxd.servers import wait_until


def get(stack: Stack, path: str, key: str = KEY_A, **params: str) -> httpx.Response:
    return httpx.get(f"{stack.api_url}{path}", params=params, headers={"X-API-Key": key})


def test_metrics_of_a_running_sandbox_then_404_once_killed(stack: Stack) -> None:
    sandbox = Sandbox.create(**stack.sdk())
    try:
        metrics = wait_until(sandbox.get_metrics, what="a first usage sample")
        newest = metrics[-1]
        assert newest.cpu_count == 1
        assert newest.mem_total == 512 << 20
        assert 0 < newest.mem_used < newest.mem_total
        assert newest.disk_total > 0
        raw = get(stack, f"/sandboxes/{sandbox.sandbox_id}/metrics").json()[-1]
        assert set(raw) == {
            "timestamp", "timestampUnix", "cpuCount", "cpuUsedPct", "memUsed", "memTotal",
            "memCache", "diskUsed", "diskTotal",
        }  # fmt: skip
        later = get(
            stack, f"/sandboxes/{sandbox.sandbox_id}/metrics", start=str(raw["timestampUnix"] + 60)
        )
        assert later.json() == []
        bad = get(stack, f"/sandboxes/{sandbox.sandbox_id}/metrics", start="yesterday")
        assert bad.status_code == 400
        assert bad.json()["code"] == 400
        # /sandboxes/metrics is its own route, not a sandbox called "metrics"
        many = get(stack, "/sandboxes/metrics", sandbox_ids=f"{sandbox.sandbox_id},sb-000000000000")
        assert many.status_code == 200
        assert list(many.json()["sandboxes"]) == [sandbox.sandbox_id]
        assert get(stack, "/sandboxes/metrics").status_code == 400
        other = get(stack, "/sandboxes/metrics", key=KEY_B, sandbox_ids=sandbox.sandbox_id)
        assert other.json() == {"sandboxes": {}}  # another key's sandbox is not seen
    finally:
        sandbox.kill()
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_metrics(sandbox.sandbox_id, **stack.sdk())
    gone = get(stack, f"/sandboxes/{sandbox.sandbox_id}/metrics")
    assert gone.status_code == 404
    assert gone.json() == {"code": 404, "message": f"sandbox {sandbox.sandbox_id!r} not found"}


def test_logs_of_the_lifecycle_with_paging_and_filters(stack: Stack) -> None:
    sandbox = Sandbox.create(**stack.sdk())
    path = f"/sandboxes/{sandbox.sandbox_id}/logs"
    live = get(stack, path).json()
    lines = [json.loads(line["line"]) for line in live["logs"]]
    assert [line["message"] for line in lines] == ["sandbox created", "sandbox claimed"]
    assert lines[0]["level"] == "info"
    assert lines[0]["logger"] == "sandboxd"
    assert live["logEntries"][1]["fields"]["sandboxID"] == sandbox.sandbox_id.replace("-", "_")
    assert live["logEntries"][1]["level"] == "info"
    sandbox.pause()
    Sandbox.connect(sandbox.sandbox_id, **stack.sdk())
    sandbox.kill()

    v2 = f"/v2/sandboxes/{sandbox.sandbox_id}/logs"
    messages = [entry["message"] for entry in get(stack, v2).json()["logs"]]
    assert messages == [
        "sandbox created",
        "sandbox claimed",
        "sandbox paused",
        "sandbox resumed",
        "sandbox killed",
    ]
    last = get(stack, v2, direction="backward", limit="1").json()["logs"]
    assert [entry["message"] for entry in last] == ["sandbox killed"]
    assert get(stack, v2, search="paus").json()["logs"][0]["message"] == "sandbox paused"
    assert get(stack, v2, level="warn").json() == {"logs": []}
    assert len(get(stack, v2, limit="2").json()["logs"]) == 2
    paused = datetime.fromisoformat(get(stack, v2).json()["logs"][2]["timestamp"])
    cursor = str(int(paused.timestamp() * 1000))
    after = [entry["message"] for entry in get(stack, v2, cursor=cursor).json()["logs"]]
    assert after == ["sandbox paused", "sandbox resumed", "sandbox killed"]
    future = get(stack, v2, cursor=str(10**13)).json()
    assert future == {"logs": []}
    assert get(stack, v2, direction="sideways").status_code == 400
    assert get(stack, v2, key=KEY_B).status_code == 404  # another key's sandbox
    assert get(stack, "/v2/sandboxes/sb-000000000000/logs").status_code == 404

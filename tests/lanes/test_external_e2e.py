"""The external kit end to end: ``sandboxctl lanes run --kit external`` as a process,
pointed at a local kit's endpoints and credentials through a lanes.yaml, its faults done
by the file's shell commands (curl to an operator's endpoint this test serves, which acts
on the local kit). The lanes pass, and the commands ran as the lanes and heal asked."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from sandboxctl.lanes.local import LocalKit, local_kit, unavailable
from sandboxctl.lanes.progress import ConsoleProgress

RUN_TIMEOUT = 300

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))


class Operator:
    """What an operator's automation would be: ``POST /OPERATION/LABEL`` acts on the kit's
    host (or on the control plane), ``GET /packets_to_agent/LABEL`` and
    ``GET /replica_log/NAME`` answer the facts. Records every call."""

    def __init__(self, kit: LocalKit) -> None:
        self.calls: list[str] = []
        operator = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                self._answer(operator.act(self.path))

            def do_GET(self) -> None:
                self._answer(operator.act(self.path))

            def _answer(self, text: str) -> None:
                data = text.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.kit = kit
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def act(self, path: str) -> str:
        operation, _, target = path.strip("/").partition("/")
        self.calls.append(f"{operation} {target}".strip())
        kit = self.kit
        host = {"A": kit.a, "B": kit.b}.get(target)
        if operation == "replica_log":
            return kit.replica_log(next(r for r in kit.replicas if r.name == target))
        if operation == "packets_to_agent" and host is not None:
            return f"{kit.packets_to_agent(host)}\n"
        if operation == "start_publisher_unstamped" and host is not None:
            kit.start_publisher(host, stamp=False)
        elif host is not None:
            getattr(kit, operation)(host)
        else:
            getattr(kit, operation)()
        return ""

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def kit() -> Iterator[LocalKit]:
    with local_kit(ConsoleProgress(Console(stderr=True, no_color=True))) as built:
        yield built


def _config(kit: LocalKit, operator: Operator, directory: Path) -> Path:
    secrets = {
        "e2b.key": kit.credentials.e2b_key,
        "kube.token": kit.credentials.kube_token,
        "agent.token": kit.credentials.root_token,
    }
    for name, value in secrets.items():
        (directory / name).write_text(value + "\n")
    host_commands = ("kill_host", "start_host", "stop_publisher", "start_publisher",
                     "start_publisher_unstamped")  # fmt: skip
    commands = {
        name: f"curl -fsS -X POST {operator.url}/{name}/{{label}}" for name in host_commands
    }
    commands |= {
        "stop_control_plane": f"curl -fsS -X POST {operator.url}/stop_control_plane",
        "start_control_plane": f"curl -fsS -X POST {operator.url}/start_control_plane",
        "packets_to_agent": f"curl -fsS {operator.url}/packets_to_agent/{{label}}",
        "replica_log": f"curl -fsS {operator.url}/replica_log/{{replica}}",
    }
    document = {
        "name": "local-as-external",
        "windows": {
            "publish": f"{kit.windows.publish:g}s",
            "stale_after": f"{kit.windows.stale_after:g}s",
        },
        "hosts": {
            host.label.lower(): {"node": host.node, "agent_url": host.agent_url}
            for host in (kit.a, kit.b)
        },
        "replicas": [
            {"name": r.name, "kube_url": r.kube_url, "e2b_url": r.e2b_url} for r in kit.replicas
        ],
        "proxy_url": kit.proxy_url,
        "domain": kit.domain,
        "kubeconfig": str(kit.kubeconfig),
        "warm_pool": kit.warm_pool,
        "warm_pool_size": 4,
        "template": kit.template,
        "credentials": {
            "e2b_key": "e2b.key",
            "kube_token": "kube.token",
            "agent_token": "agent.token",
        },
        "command_timeout": "60s",
        "commands": commands,
    }
    path = directory / "lanes.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_the_external_kit_runs_lanes_on_a_deployment_it_reaches_by_its_file(
    kit: LocalKit, tmp_path: Path
) -> None:
    operator = Operator(kit)
    try:
        config = _config(kit, operator, tmp_path)
        report = tmp_path / "report.json"
        done = subprocess.run(
            [sys.executable, "-m", "sandboxctl", "lanes", "run", "SBL-09", "K1C",
             "--kit", "external", "--config", str(config), "--report", str(report)],
            capture_output=True, text=True, timeout=RUN_TIMEOUT,
        )  # fmt: skip
    finally:
        operator.close()
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    body = json.loads(report.read_text())
    assert body["kit"] == "external"  # the file names the deployment: local-as-external
    assert {lane["lane"]: lane["result"] for lane in body["lanes"]} == {
        "SBL-09": "PASS",
        "K1C-01": "PASS",
    }
    # K1C replaced B's publisher by an unstamped one and put a stamping one back.
    assert [call for call in operator.calls if "publisher" in call] == [
        "stop_publisher B",
        "start_publisher_unstamped B",
        "start_publisher B",
    ]

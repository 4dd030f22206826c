"""A real ``serve-sandboxd`` killed with SIGKILL keeps its sandboxes filtered; the next
start adopts them with their networks, and ``--destroy-on-exit`` leaves nothing."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

from sandboxctl.agentapi import AgentClient, ClaimRequest
from sandboxctl.core.netpolicy import policy
from sandboxctl_testing.nethost import net_host
from tests.sandboxd.network.leftovers import count_leftovers
from tests.sandboxd.servers import agent_process, free_port

PORT = 8080
PROBE = (
    "import socket, sys\n"
    "try:\n"
    "    print('open', socket.create_connection((sys.argv[1], 8080), 1.5).recv(100).decode())\n"
    "except OSError as e:\n"
    "    print('blocked', type(e).__name__)\n"
)


def reach(state: Path, sandbox_id: str, address: str) -> str:
    """Connect from the sandbox's network namespace (as root: the filter sees its veth)."""
    with sqlite3.connect(state / "sandboxd.sqlite") as db:
        (pid,) = db.execute("select pid from sandboxes where id = ?", (sandbox_id,)).fetchone()
    done = subprocess.run(
        ["nsenter", f"--net=/proc/{pid}/ns/net", "python3", "-c", PROBE, address],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def test_kill_9_restart_adoption_and_destroy_on_exit(state_dir: Path, uid_base: int) -> None:
    address = f"127.0.0.1:{free_port()}"
    state = state_dir / "sd"
    args = ["--listen", address, "--state-dir", str(state), "--pool", "base=1",
            "--uid-base", str(uid_base), "--sandbox-dns", "none"]  # fmt: skip
    with net_host(extra_addresses=1) as host:
        target = host.addresses[0]
        host.serve_tcp(target, PORT)
        with agent_process(args, address) as first, AgentClient(f"http://{address}") as client:
            online = client.claim(ClaimRequest("base", network=policy(True))).id
            offline = client.claim(ClaimRequest("base")).id
            row = client.get(online)
            assert reach(state, online, target) == f"open {host.gateway}"
            first.kill()  # SIGKILL: no cleanup at all
            first.wait()
        key = (state / "runtime").resolve().name
        subnet = str(row.address.rpartition(".")[0]) + ".0/24"
        # While the agent is down its sandboxes stay filtered.
        assert reach(state, online, target) == f"open {host.gateway}"
        assert reach(state, offline, target).startswith("blocked")
        with (
            agent_process([*args, "--destroy-on-exit"], address),
            AgentClient(f"http://{address}") as client,
        ):
            assert client.get(online).address == row.address  # adopted, same address
            assert reach(state, online, target) == f"open {host.gateway}"
            assert reach(state, offline, target).startswith("blocked")
        assert count_leftovers(key, subnet, uid_base) == {
            "veths": 0, "routes": 0, "chains": 0, "elements": 0, "namespaces": 0,
        }  # fmt: skip

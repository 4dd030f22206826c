"""Every sandbox's network, with real namespaces, veths, NAT and nftables rules.

The only traffic leaves for test hosts in namespaces this test makes (198.51.100.0/24,
no default route) and loopback.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from sandboxctl.agentapi.models import ClaimRequest
from sandboxctl.agentapi.network import NetworkUpdate
from sandboxctl.core.netpolicy import policy
from sandboxctl.envd.host import Command
from sandboxctl.sandboxd import entering
from sandboxctl.sandboxd.agent import Agent
from sandboxctl.sandboxd.errors import BadRequest
from sandboxctl.sandboxd.network import sandboxes
from sandboxctl.sandboxd.network.firewall import GUEST_MARK, table_name
from sandboxctl.sandboxd.network.links import host_end
from sandboxctl.sandboxd.state import SandboxRecord
from sandboxctl_testing.nethost import NetHost, net_host
from tests.sandboxd.network.leftovers import count_leftovers
from tests.sandboxd.servers import start_agent, wait_until

PORT = 8080
CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), 1.5)\n"
    "except OSError as e:\n"
    "    sys.exit(print('blocked', type(e).__name__))\n"
    "try:\n"
    "    print('open', s.recv(100).decode())\n"
    "except TimeoutError:\n"
    "    print('open')\n"  # a server that waits for the client to speak first
)


def inside(agent: Agent, record: SandboxRecord, *argv: str) -> str:
    entry = agent.runtime.enter(agent.spec(record), agent.identity(record), Command(argv))
    done = entering.run(entry, timeout=30, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def reach(agent: Agent, record: SandboxRecord, host: str, port: int = PORT) -> str:
    """``open <what the server said>`` or ``blocked <error>``."""
    return inside(agent, record, "python3", "-c", CONNECT, host, str(port))


@pytest.fixture
def testhost() -> NetHost:
    with net_host(extra_addresses=2) as host:
        for address in host.addresses:
            host.serve_tcp(address, PORT)
        yield host  # type: ignore[misc]


def test_a_sandbox_with_internet_reaches_a_test_host_through_nat(
    network_agent: Callable[..., Agent], testhost: NetHost
) -> None:
    agent = network_agent()
    start_agent(agent)
    online = agent.claim(ClaimRequest("base", net="egress"))
    offline = agent.claim(ClaimRequest("base"))
    target = testhost.addresses[0]
    # The test host sees the host's own address on its link: the sandbox was masqueraded.
    assert reach(agent, online, target) == f"open {testhost.gateway}"
    assert reach(agent, offline, target).startswith("blocked")
    routes = inside(agent, online, "ip", "route")
    assert f"default via {agent.network.subnet.gateway}" in routes  # type: ignore[union-attr]


def test_the_host_loopback_abstract_sockets_and_other_sandboxes_are_out_of_reach(
    network_agent: Callable[..., Agent], testhost: NetHost
) -> None:
    agent = network_agent()
    start_agent(agent)
    one = agent.claim(ClaimRequest("base", network=policy(True)))
    other = agent.claim(ClaimRequest("base", network=policy(True)))
    with socket.create_server(("0.0.0.0", 0)) as listener, socket.socket(socket.AF_UNIX) as unix:
        port = listener.getsockname()[1]
        unix.bind(b"\0sandboxctl-test-" + str(port).encode())
        unix.listen(1)
        gateway = agent.network.subnet.gateway  # type: ignore[union-attr]
        for host_address in (testhost.gateway, gateway, "127.0.0.1"):
            assert reach(agent, one, host_address, port).startswith("blocked"), host_address
        abstract = inside(
            agent, one, "python3", "-c",
            "import socket\ns = socket.socket(socket.AF_UNIX)\n"
            f"try:\n s.connect(b'\\0sandboxctl-test-{port}'); print('open')\n"
            "except OSError as e: print('blocked', type(e).__name__)",
        )  # fmt: skip
        assert abstract.startswith("blocked")
    inside(agent, other, "sh", "-c", f"python3 -m http.server {PORT} >/dev/null 2>&1 & sleep 0.5")
    assert reach(agent, other, "127.0.0.1").startswith("open")  # it listens
    assert reach(agent, one, other.address).startswith("blocked")


def test_the_host_reaches_a_sandbox_server_through_its_veth_and_other_sandboxes_do_not(
    network_agent: Callable[..., Agent],
) -> None:
    """What the envd proxy does for a guest port listening on the sandbox's address: a
    connection from the host, bound to the sandbox's veth and carrying the guest mark, is
    answered (the filter lets the answers of such connections in); one without the mark
    (any unprivileged process on the host) is not; another sandbox cannot connect."""
    agent = network_agent()
    start_agent(agent)
    server = agent.claim(ClaimRequest("base"))  # no internet: reaching it needs none
    other = agent.claim(ClaimRequest("base", network=policy(True)))
    inside(agent, server, "sh", "-c", f"python3 -m http.server {PORT} >/dev/null 2>&1 &")
    wait_until(
        lambda: reach(agent, server, "127.0.0.1").startswith("open"),
        timeout=20,
        interval=0.1,
        what="the server in the sandbox to listen",
    )
    with socket.socket() as unmarked:
        unmarked.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, host_end(server.id).encode())
        unmarked.settimeout(1)
        assert unmarked.connect_ex((server.address, PORT)) != 0  # its answers are dropped
    with socket.socket() as host_side:
        host_side.setsockopt(
            socket.SOL_SOCKET, socket.SO_BINDTODEVICE, host_end(server.id).encode()
        )
        host_side.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, GUEST_MARK)
        host_side.settimeout(5)
        host_side.connect((server.address, PORT))
        host_side.sendall(b"HEAD / HTTP/1.0\r\n\r\n")
        assert host_side.recv(100).startswith(b"HTTP/1.0 200")
    assert reach(agent, other, server.address).startswith("blocked")
    # Bound to another sandbox's veth, the host does not reach this one's address.
    with socket.socket() as wrong:
        wrong.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, host_end(other.id).encode())
        wrong.settimeout(1)
        assert wrong.connect_ex((server.address, PORT)) != 0


def test_allow_wins_over_deny_and_rules_change_live(
    network_agent: Callable[..., Agent], testhost: NetHost
) -> None:
    agent = network_agent()
    start_agent(agent)
    first, second = testhost.addresses
    record = agent.claim(
        ClaimRequest("base", network=policy(True, deny_out=[f"{testhost.gateway}/29"]))
    )
    assert reach(agent, record, first).startswith("blocked")
    assert reach(agent, record, second).startswith("blocked")

    agent.set_network(record.id, NetworkUpdate(allow_out=(second,), deny_out=("0.0.0.0/0",)))
    assert reach(agent, record, first).startswith("blocked")
    assert reach(agent, record, second).startswith("open")

    agent.set_network(record.id, NetworkUpdate(internet=False, allow_out=(first,)))
    assert reach(agent, record, first).startswith("open")
    assert reach(agent, record, second).startswith("blocked")
    assert agent.get(record.id).net == "none"

    with pytest.raises(BadRequest, match=r"network\.allowOut: 'example\.com' is a domain"):
        agent.set_network(record.id, NetworkUpdate(allow_out=("example.com",)))


def test_dns_is_forwarded_for_sandboxes_with_internet_only(
    network_agent: Callable[..., Agent], testhost: NetHost
) -> None:
    resolver = testhost.addresses[1]
    testhost.serve_dns(resolver, "198.51.100.77")
    agent = network_agent(dns=(resolver, 53))
    start_agent(agent)
    online = agent.claim(ClaimRequest("base", network=policy(True)))
    offline = agent.claim(ClaimRequest("base", network=policy(False)))
    lookup = (
        "import socket\ntry: print(socket.gethostbyname('where.test'))\n"
        "except OSError as e: print('failed', type(e).__name__)"
    )
    assert inside(agent, online, "python3", "-c", lookup) == "198.51.100.77"
    assert inside(agent, offline, "python3", "-c", lookup).startswith("failed")


# Run with RES_OPTIONS "timeout:1 attempts:1": a lookup that waits for a DNS answer
# which never comes gives up after 1 s (glibc's own default is 5 s, twice).
OWN_NAME_AND_DNS = """
import socket, sys
name = socket.gethostname()
try:
    print("resolved", socket.gethostbyname(name), socket.getfqdn())
except OSError as error:
    print("unresolved", type(error).__name__)
# A query for where.test, type A: to the gateway, over UDP then TCP.
query = bytes.fromhex("123401000001000000000000057768657265047465737400" "00010001")
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.settimeout(2)
udp.connect((sys.argv[1], 53))
udp.send(query)
try:
    udp.recv(512)
    print("udp answered")
except OSError as error:
    print("udp", type(error).__name__)
try:
    socket.create_connection((sys.argv[1], 53), 2)
    print("tcp open")
except OSError as error:
    print("tcp", type(error).__name__)
"""


def test_a_sandbox_resolves_its_own_name_and_dns_it_may_not_use_is_refused_at_once(
    network_agent: Callable[..., Agent], testhost: NetHost
) -> None:
    """Its hostname is in its /etc/hosts at its own address, so resolving it asks no
    DNS server (``python3 -m http.server`` does before it listens); and a sandbox
    without internet, whose DNS the filter does not let through, is told so at once (a
    refusal, not a query that waits for its timeout)."""
    resolver = testhost.addresses[1]
    testhost.serve_dns(resolver, "198.51.100.77")
    agent = network_agent(dns=(resolver, 53))
    start_agent(agent)
    offline = agent.claim(ClaimRequest("base", network=policy(False)))
    online = agent.claim(ClaimRequest("base", network=policy(True)))
    gateway = agent.network.subnet.gateway  # type: ignore[union-attr]
    probe = ("env", "RES_OPTIONS=timeout:1 attempts:1", "python3", "-c", OWN_NAME_AND_DNS)
    name = offline.id.replace("_", "-")
    assert inside(agent, offline, *probe, gateway).splitlines() == [
        f"resolved {offline.address} {name}",
        "udp ConnectionRefusedError",
        "tcp ConnectionRefusedError",
    ]
    assert inside(agent, online, *probe, gateway).splitlines() == [
        f"resolved {online.address} {online.id.replace('_', '-')}",
        "udp answered",  # its DNS goes through
        "tcp open",
    ]
    # Any other refused egress is refused alike: a reset, not a connect that times out.
    assert reach(agent, offline, testhost.addresses[0]) == "blocked ConnectionRefusedError"


def test_nothing_is_refused_before_its_source_is_checked(
    network_agent: Callable[..., Agent],
) -> None:
    """A refusal is a packet the host sends to the refused packet's source: a spoofed
    source must be dropped first, or a sandbox could aim resets and ICMP at anyone."""
    agent = network_agent()
    start_agent(agent)
    table = table_name(agent.network.key)  # type: ignore[union-attr]
    for chain in ("from_sandbox", "to_host"):
        listed = subprocess.run(
            ["nft", "list", "chain", "inet", table, chain], capture_output=True, text=True
        )
        rules = [line.strip() for line in listed.stdout.splitlines()]
        spoofed = next(i for i, rule in enumerate(rules) if "!= @members drop" in rule)
        ipv6 = next(i for i, rule in enumerate(rules) if rule == "meta nfproto ipv6 drop")
        refusals = [i for i, rule in enumerate(rules) if "jump refuse" in rule]
        assert refusals, chain
        assert min(refusals) > max(spoofed, ipv6), chain


def settle(agent: Agent) -> None:
    """Wait until the running agent's warm pools are full and no refill is under way (a
    refill mid-start has its chain before its veth)."""
    wait_until(
        lambda: not any(p.warm < p.target or p.refilling for p in agent.info().pools),
        timeout=30,
        interval=0.05,
        what="the warm pool to settle",
    )


def leftovers(agent: Agent) -> dict[str, int]:
    assert agent.network is not None
    return count_leftovers(agent.network.key, str(agent.network.subnet), agent.settings.uid_base)


def test_nothing_of_a_gone_sandbox_is_left_after_release_restart_and_destroy_on_exit(
    network_agent: Callable[..., Agent], testhost: NetHost
) -> None:
    agent = network_agent()
    start_agent(agent)
    kept = agent.claim(ClaimRequest("base", network=policy(True)))
    released = agent.claim(ClaimRequest("base", network=policy(True)))
    agent.release(released.id)
    settle(agent)
    before = leftovers(agent)
    # Each live sandbox (the kept one, warm ones the refill started) has a chain and a
    # veth; the released one has neither.
    assert before["chains"] >= 1
    assert before["veths"] == before["chains"]
    assert not Path("/sys/class/net", host_end(released.id)).exists()

    agent.stop(destroy=False)  # the sandboxes keep running, filtered, while it is down
    assert reach(agent, kept, testhost.addresses[0]).startswith("open")
    again = network_agent()
    start_agent(again)  # adopts: re-attaches each network, rebuilds the table from them
    kept = again.get(kept.id)
    assert reach(again, kept, testhost.addresses[0]).startswith("open")
    settle(again)
    assert leftovers(again)["chains"] >= 1

    again.stop(destroy=True)
    assert leftovers(again) == {
        "veths": 0, "routes": 0, "chains": 0, "elements": 0, "namespaces": 0,
    }  # fmt: skip


HOLD = (
    "import socket, sys\n"
    "held = []\n"
    "for _ in range(int(sys.argv[3])):\n"
    "    try:\n"
    "        held.append(socket.create_connection((sys.argv[1], int(sys.argv[2])), 1.5))\n"
    "    except OSError:\n"
    "        break\n"
    "print(len(held), flush=True)\n"
)


def test_a_sandbox_has_at_most_its_share_of_the_hosts_connection_tracking(
    network_agent: Callable[..., Agent], testhost: NetHost
) -> None:
    """The host's conntrack table carries every sandbox's connections: one sandbox that
    opens connections without end is refused past its own count, and the others, and
    the host, still connect."""
    agent = network_agent(connections=8)
    start_agent(agent)
    greedy = agent.claim(ClaimRequest("base", network=policy(True)))
    other = agent.claim(ClaimRequest("base", network=policy(True)))
    target = testhost.addresses[0]
    testhost.serve_tcp(target, PORT + 1, mode="sink")  # keeps what it accepts open
    hold = Command(
        ["python3", "-c", HOLD + "import time\ntime.sleep(60)", target, str(PORT + 1), "50"]
    )
    holder = entering.popen(
        agent.runtime.enter(agent.spec(greedy), agent.identity(greedy), hold),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "8"  # the ninth was refused
        assert reach(agent, greedy, target).startswith("blocked")
        assert reach(agent, other, target) == f"open {testhost.gateway}"
        with socket.create_connection((target, PORT), 5):
            pass  # the host's own connections are not a sandbox's
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # its group: the command inside too
        holder.communicate()


def test_a_block_never_covers_an_address_the_hosts_file_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package mirror named in /etc/hosts and reached by the default route: a test
    host's block over it would take the mirror's traffic (apt fails: no route to host)."""
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n203.0.113.80  deb.debian.org  # the mirror\nbad\n")
    assert sandboxes.named_addresses(hosts) == ["203.0.113.80/32"]
    monkeypatch.setattr(sandboxes, "HOSTS_FILE", hosts)
    # This machine's own routes and addresses left out: a kit beside the test may hold a
    # block of this range right now.
    monkeypatch.setattr(sandboxes, "_ip_json", lambda args: [])
    net = ipaddress.IPv4Network("203.0.113.64/27")  # two /28: .64 and .80
    for pid in (0, 1):  # the search starts at the pid's offset: from either block
        monkeypatch.setattr(sandboxes.os, "getpid", lambda pid=pid: pid)
        assert sandboxes.free_block(net, 28) == ipaddress.IPv4Network("203.0.113.64/28")

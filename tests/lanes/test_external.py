"""The external kit: its file (the example in docs parses; what a file lacks or gets wrong
is one line naming it; a lane's needs are checked before anything runs), and each fault
and fact run as the operator's shell command, templated with the host it acts on."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from sandboxctl.lanes import catalog
from sandboxctl.lanes.external import ExternalKit, external_kit
from sandboxctl.lanes.kit import Host, Kit, Replica
from sandboxctl.lanes.kitfile import COMMANDS, lacking, load
from sandboxctl.lanes.model import EXTERNAL, LaneError
from sandboxctl.lanes.progress import ConsoleProgress

DOCS = Path(__file__).resolve().parents[2] / "docs"
EXAMPLE = DOCS / "lanes.example.yaml"


def _files(directory: Path) -> None:
    """The files a config names beside it (credentials, kubeconfig)."""
    (directory / "secrets").mkdir(exist_ok=True)
    for name, text in {
        "kubeconfig": "apiVersion: v1\nkind: Config\n",
        "secrets/e2b.key": "e2b_key123\n",
        "secrets/kube.token": "  kube-token\n",
        "secrets/agent.token": "agent-token",
        "secrets/ca.pem": "not read until a client is made\n",
    }.items():
        (directory / name).write_text(text)


MINIMAL = """\
windows: {publish: 3s, stale_after: 9s}
hosts:
  a: {node: node-a, agent_url: "http://127.0.0.1:1"}
  b: {node: node-b, agent_url: "http://127.0.0.1:2"}
replicas:
  - {name: r1, kube_url: "http://127.0.0.1:3", e2b_url: "http://127.0.0.1:4"}
proxy_url: "http://127.0.0.1:5"
domain: sandbox.test
kubeconfig: kubeconfig
warm_pool: default/lanes
credentials: {e2b_key: secrets/e2b.key, kube_token: secrets/kube.token,
              agent_token: secrets/agent.token}
"""


def _config(directory: Path, text: str) -> Path:
    _files(directory)
    path = directory / "lanes.yaml"
    path.write_text(text)
    return path


def _refusal(path: Path) -> str:
    with pytest.raises(LaneError) as caught:
        load(path)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_the_example_file_parses_and_names_a_command_for_every_lane(tmp_path: Path) -> None:
    shutil.copy(EXAMPLE, tmp_path / "lanes.yaml")
    _files(tmp_path)
    config = load(tmp_path / "lanes.yaml")
    assert (config.windows.publish, config.windows.stale_after) == (30.0, 90.0)
    assert (config.a.label, config.a.node, config.b.node) == ("A", "k1-a", "k1-b")
    assert [r.name for r in config.replicas] == ["sandbox-apiserver-0", "sandbox-apiserver-1"]
    assert config.kubeconfig == tmp_path / "kubeconfig"
    assert config.credentials.ca_bundle == tmp_path / "secrets" / "ca.pem"
    assert config.command_timeout == 120.0
    assert config.warm_pool_size == 4
    external = [lane for lane in catalog.lanes() if EXTERNAL in lane.kits]
    assert external, "no lane runs on the external kit"
    assert lacking(config, external) == []
    assert set(config.commands) == set(COMMANDS) - {"heal"}


def test_the_example_in_the_docs_parses_too(tmp_path: Path) -> None:
    text = (DOCS / "lanes.md").read_text()
    block = text.split("### Example", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    config = load(_config(tmp_path, block))
    assert (config.windows.publish, len(config.replicas), config.warm_pool_size) == (30.0, 2, 4)
    assert lacking(config, catalog.lanes()) == []


def test_what_the_file_lacks_is_named_in_one_line(tmp_path: Path) -> None:
    text = MINIMAL.replace("domain: sandbox.test\n", "").replace(
        "kube_token: secrets/kube.token,", ""
    )
    message = _refusal(_config(tmp_path, text))
    assert message.endswith("lacks domain, credentials.kube_token")


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (("publish: 3s", "publish: soon"), "windows.publish: 'soon' is not a duration"),
        (("stale_after: 9s", "stale_after: 2s"), "must be above windows.publish"),
        (("e2b_key: secrets/e2b.key", "e2b_key: nowhere.key"), "nowhere.key: no such file"),
        (("replicas:\n", "replicas: 3\nx:\n"), "replicas: expected a list"),
    ],
)
def test_a_wrong_value_is_named_in_one_line(
    tmp_path: Path, change: tuple[str, str], said: str
) -> None:
    assert change[0] in MINIMAL
    assert said in _refusal(_config(tmp_path, MINIMAL.replace(*change)))


def test_commands_must_be_known_operations_with_known_placeholders(tmp_path: Path) -> None:
    text = MINIMAL + "commands:\n  kill_host: ssh {host} kill\n  reboot: reboot\n"
    message = _refusal(_config(tmp_path, text))
    assert "commands.kill_host: unknown placeholder {host} (known: {label} {node} {agent_url})" in (
        message
    )
    assert "commands.reboot: no such operation" in message
    # Braces that are no placeholder (awk, nft) are the shell's.
    text = MINIMAL + "commands:\n  packets_to_agent: \"awk '{ print 7 }' /dev/null\"\n"
    assert load(_config(tmp_path, text)).commands["packets_to_agent"].startswith("awk")


def test_a_file_that_is_not_a_mapping_of_settings_is_refused(tmp_path: Path) -> None:
    assert "(line 2, column 1)" in _refusal(_config(tmp_path, "windows: [\n"))
    assert "expected a mapping" in _refusal(_config(tmp_path, "- a\n"))
    assert "No such file" in _refusal(tmp_path / "absent.yaml")


def test_the_selected_lanes_needs_are_checked_before_anything_runs(tmp_path: Path) -> None:
    path = _config(tmp_path, MINIMAL + "commands:\n  stop_publisher: 'true'\n")
    k1c = [lane for lane in catalog.lanes() if lane.group == "K1C"]
    progress = ConsoleProgress(Console(stderr=True, no_color=True))
    with pytest.raises(LaneError) as caught, external_kit(path, k1c, progress):
        pytest.fail("the kit opened")  # the agents named do not exist: heal would hang
    assert str(caught.value) == (
        f"--config {path} lacks commands.start_publisher (K1C-01), "
        "commands.start_publisher_unstamped (K1C-01) for the selected lanes"
    )


def _run_external(selector: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandboxctl", "lanes", "run", selector, "--kit", "external",
         "--config", str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_cli_refuses_such_a_file_in_one_line_with_exit_2(tmp_path: Path) -> None:
    path = _config(tmp_path, MINIMAL)
    done = _run_external("K1OUT", path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"sandboxctl: error: --config {path} lacks commands.")
    assert "commands.stop_control_plane (K1OUT-01)" in lines[0]
    assert "commands.start_control_plane (K1OUT-01)" in lines[0]


# --- the operations ----------------------------------------------------------------------


def _kit(tmp_path: Path, commands: dict[str, str]) -> ExternalKit:
    body = "".join(f"  {name}: {command!r}\n" for name, command in commands.items())
    text = MINIMAL.replace("node: node-b", 'node: "node b\'s"')
    return ExternalKit(load(_config(tmp_path, f"{text}command_timeout: 2s\ncommands:\n{body}")))


def _placeholders(fields: tuple[str, ...]) -> str:
    return " ".join("{" + name + "}" for name in fields)


def test_each_operation_runs_its_command_with_the_host_filled_in(tmp_path: Path) -> None:
    log = tmp_path / "ran.log"
    commands = {
        name: f"printf '%s|' {name} {_placeholders(fields)} >> ran.log; echo >> ran.log"
        for name, fields in COMMANDS.items()
        if name not in ("packets_to_agent", "replica_log")
    }
    commands["packets_to_agent"] = "echo counting {node} >&2; printf 'header\\n 42\\n'"
    commands["replica_log"] = "echo log of {replica} at {kube_url}"
    kit: Kit = _kit(tmp_path, commands)
    b = kit.b
    kit.kill_host(b)
    kit.start_host(b)
    kit.stop_publisher(b)
    kit.start_publisher(b, stamp=False)
    kit.start_publisher(b)
    kit.stop_control_plane()
    kit.start_control_plane()
    assert kit.packets_to_agent(b) == 42
    assert kit.replica_log(kit.replicas[0]) == "log of r1 at http://127.0.0.1:3\n"
    host = "B|node b's|http://127.0.0.1:2|"
    assert log.read_text().splitlines() == [
        f"kill_host|{host}",
        f"start_host|{host}",
        f"stop_publisher|{host}",
        f"start_publisher_unstamped|{host}",
        f"start_publisher|{host}",
        "stop_control_plane|",
        "start_control_plane|",
    ]


def test_restore_starts_again_only_what_the_kit_stopped(tmp_path: Path) -> None:
    commands = {name: f"echo {name} {{label}} >> ran.log" for name in COMMANDS if "host" in name}
    commands |= {name: f"echo {name} >> ran.log" for name in COMMANDS if "control" in name}
    commands |= {name: f"echo {name} {{label}} >> ran.log" for name in COMMANDS
                 if "publisher" in name}  # fmt: skip
    kit = _kit(tmp_path, commands)
    kit.restore()
    assert not (tmp_path / "ran.log").exists()
    kit.kill_host(kit.b)
    kit.start_publisher(kit.a, stamp=False)
    kit.stop_control_plane()
    kit.restore()
    kit.restore()  # nothing left to restore
    assert (tmp_path / "ran.log").read_text().splitlines() == [
        "kill_host B",
        "start_publisher_unstamped A",
        "stop_control_plane",
        "start_control_plane",
        "start_publisher A",
        "start_host B",
    ]


def test_a_failing_silent_or_slow_command_fails_in_one_line(tmp_path: Path) -> None:
    commands = {
        "kill_host": "echo no route to {node} >&2; exit 3",
        "packets_to_agent": "echo many",
        "stop_control_plane": "sleep 5",
    }
    kit = _kit(tmp_path, commands)
    failures = []
    for fault in (lambda: kit.kill_host(kit.a), lambda: kit.packets_to_agent(kit.a),
                  kit.stop_control_plane, kit.start_control_plane):  # fmt: skip
        with pytest.raises(LaneError) as caught:
            fault()
        failures.append(str(caught.value))
    assert failures[0] == "commands.kill_host exited 3: echo no route to node-a >&2; exit 3: " + (
        "no route to node-a"
    )
    assert failures[1] == "commands.packets_to_agent printed 'many', not a count"
    assert failures[2] == "commands.stop_control_plane did not end within 2 s: sleep 5"
    assert failures[3].endswith("lacks commands.start_control_plane")
    assert all("\n" not in failure for failure in failures)


def test_the_clients_carry_the_credentials_files(tmp_path: Path) -> None:
    kit = _kit(tmp_path, {})
    replica = Replica("r1", "http://127.0.0.1:3", "http://127.0.0.1:4")
    with kit.e2b(replica) as e2b, kit.kube(replica) as kube, kit.proxy() as proxy:
        assert (str(e2b.base_url), e2b.headers["X-API-Key"]) == ("http://127.0.0.1:4", "e2b_key123")
        assert kube.headers["Authorization"] == "Bearer kube-token"
        assert str(proxy.base_url) == "http://127.0.0.1:5"
    with kit.agent(Host("A", "node-a", "http://127.0.0.1:1")) as agent:
        assert agent.address == "http://127.0.0.1:1"
    assert "node-a" in kit.describe()


def test_a_ca_bundle_that_is_no_certificate_is_named_in_one_line(tmp_path: Path) -> None:
    text = MINIMAL.replace(
        "agent_token: secrets/agent.token}",
        "agent_token: secrets/agent.token,\n              ca_bundle: secrets/ca.pem}",
    )
    config = load(_config(tmp_path, text))
    with pytest.raises(LaneError, match=r"^credentials.ca_bundle: .*ca.pem: "):
        ExternalKit(config)


def test_a_fleet_that_does_not_answer_the_first_heal_is_a_failed_run_exit_1(
    tmp_path: Path,
) -> None:
    text = MINIMAL.replace("{publish: 3s, stale_after: 9s}", "{publish: 1s, stale_after: 2s}")
    path = _config(tmp_path, text)
    sbl09 = [lane for lane in catalog.lanes() if lane.id == "SBL-09"]
    assert not lacking(load(path), sbl09)  # nothing of the file is missing: this is no input error
    done = _run_external("SBL-09", path)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("sandboxctl: error: the fleet did not answer before the first lane:")

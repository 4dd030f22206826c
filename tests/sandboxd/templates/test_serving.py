"""The host agent serving templates from its store, on real bubblewrap sandboxes: a built
template hides the host's files, a template built while the agent runs is served at once,
and a template's start and ready commands run as e2b runs them."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandboxctl.agentapi.models import ClaimRequest
from sandboxctl.core.model import PoolKey
from sandboxctl.envd.host import Command
from sandboxctl.sandboxd import entering
from sandboxctl.sandboxd.agent import Agent, AgentSettings
from sandboxctl.sandboxd.bubblewrap import BubblewrapRuntime
from sandboxctl.sandboxd.errors import UnknownTemplate
from sandboxctl.sandboxd.runtime import RuntimeFailure
from sandboxctl.sandboxd.state import SandboxRecord
from sandboxctl.sandboxd.templates.store import Template, TemplateStore
from tests.fleet.fleet import sandbox_uids
from tests.sandboxd.servers import sandboxes_unavailable
from tests.sandboxd.templates.cache import seed

pytestmark = pytest.mark.skipif(
    sandboxes_unavailable() is not None, reason=str(sandboxes_unavailable())
)

HTTP = "python3 -m http.server --bind 127.0.0.1 8000"
FETCH = (
    "python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:8000\").status)'"
)

Make = Callable[..., Agent]


@pytest.fixture
def make_agent(state_dir: Path, uid_base: int, store: Path) -> Iterator[Make]:
    agents: list[Agent] = []

    def make(**overrides: object) -> Agent:
        settings: dict[str, object] = dict(
            node="n1",
            advertise_addr="127.0.0.1:7777",
            state_dir=state_dir,
            max_sandboxes=4,
            uid_base=uid_base,
            template_store=store,
            host_root=False,
        )
        settings.update(overrides)
        agent = Agent(AgentSettings(**settings), BubblewrapRuntime())  # type: ignore[arg-type]
        agents.append(agent)
        return agent

    yield make
    for agent in agents:
        agent.stop(destroy=True)


def inside(agent: Agent, record: SandboxRecord, command: str) -> subprocess.CompletedProcess[str]:
    entry = agent.runtime.enter(
        agent.spec(record), agent.identity(record), Command(["/bin/sh", "-c", command])
    )
    return entering.run(entry, timeout=30, text=True)


def test_a_sandbox_of_a_built_template_cannot_see_the_host_files(
    make_agent: Make, default: Template
) -> None:
    agent = make_agent()
    info = agent.info()
    assert info.templates == ("default",)  # no host root
    [build] = info.template_builds
    assert (build.digest, build.size_bytes) == (default.build.digest, default.build.size_bytes)
    record = agent.claim(ClaimRequest(template="default"))
    assert Path("/work/main").is_dir()  # the host has it...
    looked = inside(agent, record, "ls /work/main; cat /etc/os-release; ls /root")
    assert "'/work/main': No such file or directory" in looked.stderr  # ...the sandbox not
    assert "ID=debian" in looked.stdout
    assert (
        inside(
            agent, record, "python3 -c 'import json, ctypes' && command -v bash setsid ps"
        ).returncode
        == 0
    )
    with pytest.raises(UnknownTemplate):
        agent.claim(ClaimRequest(template="base"))


def test_a_template_built_while_the_agent_runs_is_served_at_once(
    make_agent: Make, store: Path, default: Template
) -> None:
    agent = make_agent()
    assert "later" not in agent.info().templates
    seed(store, "later")
    assert agent.info().templates == ("default", "later")
    record = agent.claim(ClaimRequest(template="later"))
    assert record.key.template == "later"
    agent.release(record.id)
    with TemplateStore(store).locked():
        TemplateStore(store).remove("later")
    assert agent.info().templates == ("default",)
    with pytest.raises(UnknownTemplate):
        agent.claim(ClaimRequest(template="later"))


def test_start_command_runs_and_the_sandbox_is_ready_when_ready_says(
    make_agent: Make, store: Path, default: Template
) -> None:
    seed(store, "web", start_cmd=HTTP, ready_cmd=FETCH)
    agent = make_agent(pools={PoolKey("web"): 1})
    assert agent.refill_once() == 1  # the warm one runs its server and is ready
    for record in (agent.claim(ClaimRequest(template="web")),  # warm
                   agent.claim(ClaimRequest(template="web"))):  # cold  # fmt: skip
        served = inside(agent, record, FETCH)  # at once: no retry, no wait
        assert (served.returncode, served.stdout) == (0, "200\n"), served.stderr
        _, events = agent.events.events(record.id) or ("", [])
        messages = [event.message for event in events]
        assert messages[0] == f"start command started: {HTTP}"
        assert messages[1].startswith("sandbox ready after ")
        assert messages[2:] == ["sandbox created", "sandbox claimed"]


def test_a_sandbox_that_never_gets_ready_is_refused_and_removed(
    make_agent: Make, store: Path, uid_base: int, default: Template
) -> None:
    seed(store, "never", start_cmd="sleep 600", ready_cmd="echo not yet >&2; exit 1")
    agent = make_agent(ready_timeout=1.0)
    with pytest.raises(RuntimeFailure) as refused:
        agent.claim(ClaimRequest(template="never"))
    assert str(refused.value) == (
        "template never: the ready command 'echo not yet >&2; exit 1' did not succeed within "
        "1s (last: exit 1: not yet)"
    )
    assert not sandbox_uids(uid_base)  # its processes (the start command's too) are gone
    assert agent.info().claimed == 0
    assert list((agent.settings.state_dir / "homes").iterdir()) == []


def test_a_start_command_that_fails_ends_the_wait(
    make_agent: Make, store: Path, uid_base: int, default: Template
) -> None:
    seed(store, "crash", start_cmd="echo cannot bind >&2; exit 4", ready_cmd="false")
    agent = make_agent()  # the default wait is 60 s: the failure must not take it
    with pytest.raises(RuntimeFailure, match=r"the start command exited with code 4 before "
                       r"the sandbox was ready: cannot bind"):  # fmt: skip
        agent.claim(ClaimRequest(template="crash"))
    assert not sandbox_uids(uid_base)

"""The unmodified e2b SDK (2.63.0) against the e2b API over two real host agents.

Every call goes over loopback HTTP to the e2b app; ``sandbox_url`` points nowhere
because none of these calls reach envd. State is awaited by polling with deadlines.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import AuthenticationException, SandboxNotFoundException

from sandboxctl.apiserver import write_kubeconfig
from tests.apiserver.e2b.stack import DOMAIN, KEY_A, KEY_B, SECRET, Stack
from tests.apiserver.helpers import KUBE_TOKEN, kube_tls
from tests.sandboxd.servers import wait_until

ROOT = Path(__file__).resolve().parents[3]
KUBECTL = ROOT / ".tools" / "bin" / "kubectl"


@pytest.fixture
def created(stack: Stack) -> Iterator[list[str]]:
    """Ids the test created; whatever is still alive afterwards is killed."""
    ids: list[str] = []
    yield ids
    for sandbox_id in ids:
        for key in (KEY_A, KEY_B):
            Sandbox.kill(sandbox_id, **stack.sdk(key))


def listed(stack: Stack, key: str = KEY_A, **query: object) -> list[str]:
    paginator = Sandbox.list(query=SandboxQuery(**query), **stack.sdk(key))  # type: ignore[arg-type]
    found: list[str] = []
    while paginator.has_next:
        found.extend(info.sandbox_id for info in paginator.next_items())
    return found


def test_create_get_info_timeout_connect_kill(stack: Stack, created: list[str]) -> None:
    sandbox = Sandbox.create(
        metadata={"user": "a b&c", "k2": "v"},
        envs={"FOO": "bar"},
        timeout=120,
        **stack.sdk(),
    )
    created.append(sandbox.sandbox_id)
    assert sandbox.sandbox_id.startswith("sb-")
    assert "_" not in sandbox.sandbox_id

    info = sandbox.get_info()
    assert info.sandbox_id == sandbox.sandbox_id
    assert info.template_id == "base"
    assert info.metadata == {"user": "a b&c", "k2": "v"}
    assert info.state == SandboxState.RUNNING
    lease = (info.end_at - info.started_at).total_seconds()
    assert 100 <= lease <= 140

    sandbox.set_timeout(600)
    longer = sandbox.get_info()
    assert (longer.end_at - info.end_at).total_seconds() > 300

    # connect never shortens the lease, and its token is derived from the claim token
    again = Sandbox.connect(sandbox.sandbox_id, timeout=30, **stack.sdk())
    assert again.sandbox_id == sandbox.sandbox_id
    after = again.get_info()
    assert after.end_at >= longer.end_at
    claim = next(
        r for a in stack.agents.values() for r in a.sandboxes(None)
        if r.id.replace("_", "-") == sandbox.sandbox_id
    )  # fmt: skip
    token = hmac.new(SECRET, claim.token.encode(), hashlib.sha256).hexdigest()
    assert again._envd_access_token == token
    assert sandbox._envd_access_token == token
    assert claim.token not in str(after)

    # the other spelling of the id names the same sandbox
    assert Sandbox.get_info(claim.id, **stack.sdk()).sandbox_id == sandbox.sandbox_id

    assert sandbox.kill() is True
    assert Sandbox.kill(sandbox.sandbox_id, **stack.sdk()) is False
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sandbox.sandbox_id, **stack.sdk())


def test_list_filters_states_and_pages(stack: Stack, created: list[str]) -> None:
    marker = {"suite": "paging & more", "who": "x y"}
    for _ in range(5):
        created.append(Sandbox.create(metadata=marker, timeout=300, **stack.sdk()).sandbox_id)
    other = Sandbox.create(metadata={"suite": "paging"}, **stack.sdk()).sandbox_id
    created.append(other)

    wait_until(
        lambda: set(created) <= set(listed(stack)), what="the new sandboxes in the inventory"
    )
    assert sorted(listed(stack, metadata=marker)) == sorted(created[:5])
    assert listed(stack, metadata={"suite": "paging"}) == [other]
    assert listed(stack, metadata={"suite": "nope"}) == []

    # paged with limit=2: every page but the last is full, nothing repeats or is skipped
    paginator = Sandbox.list(query=SandboxQuery(metadata=marker), limit=2, **stack.sdk())
    pages = []
    while paginator.has_next:
        pages.append([info.sandbox_id for info in paginator.next_items()])
    assert [len(page) for page in pages] == [2, 2, 1]
    flat = [sandbox_id for page in pages for sandbox_id in page]
    assert sorted(flat) == sorted(created[:5])

    # states: pause one (over HTTP, the SDK's pause is beta) and filter on it
    import httpx

    paused = created[0]
    with httpx.Client(base_url=stack.api_url, headers={"X-API-Key": KEY_A}) as http:
        assert http.post(f"/sandboxes/{paused}/pause", json={}).status_code == 204
        assert http.post(f"/sandboxes/{paused}/pause", json={}).status_code == 409
    wait_until(
        lambda: listed(stack, metadata=marker, state=[SandboxState.PAUSED]) == [paused],
        what="the paused sandbox listed as paused",
    )
    running = listed(stack, metadata=marker, state=[SandboxState.RUNNING])
    assert sorted(running) == sorted(created[1:5])
    both = listed(stack, metadata=marker, state=[SandboxState.RUNNING, SandboxState.PAUSED])
    assert sorted(both) == sorted(created[:5])

    # connect resumes a paused sandbox
    Sandbox.connect(paused, **stack.sdk())
    assert Sandbox.get_info(paused, **stack.sdk()).state == SandboxState.RUNNING


def test_wrong_key_is_refused(stack: Stack) -> None:
    bad = stack.sdk("e2b_" + "0" * 40)
    with pytest.raises(AuthenticationException):
        Sandbox.create(**bad)
    with pytest.raises(AuthenticationException):
        Sandbox.list(**bad).next_items()


def test_two_keys_never_see_each_other(stack: Stack, created: list[str]) -> None:
    mine = Sandbox.create(metadata={"tenant": "a"}, **stack.sdk(KEY_A)).sandbox_id
    theirs = Sandbox.create(metadata={"tenant": "b"}, **stack.sdk(KEY_B)).sandbox_id
    created.extend([mine, theirs])
    wait_until(lambda: theirs in listed(stack, KEY_B), what="team-b's sandbox listed")
    wait_until(lambda: mine in listed(stack, KEY_A), what="default's sandbox listed")
    assert mine not in listed(stack, KEY_B)
    assert theirs not in listed(stack, KEY_A)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(theirs, **stack.sdk(KEY_A))
    with pytest.raises(SandboxNotFoundException):
        Sandbox.set_timeout(theirs, 60, **stack.sdk(KEY_A))
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(theirs, **stack.sdk(KEY_A))
    assert Sandbox.kill(theirs, **stack.sdk(KEY_A)) is False
    assert Sandbox.get_info(theirs, **stack.sdk(KEY_B)).metadata == {"tenant": "b"}


def test_quick_start_snippet(stack: Stack) -> None:
    """docs/e2b-compat.md's quick start, run as written, in the environment that
    .sandboxctl/e2b.env gives it."""
    snippet = "from e2b import Sandbox; s = Sandbox.create(); print(s.sandbox_id); s.kill()"
    assert snippet in (ROOT / "docs" / "e2b-compat.md").read_text()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "E2B_API_URL": stack.api_url,
        "E2B_SANDBOX_URL": "http://127.0.0.1:9",
        "E2B_API_KEY": KEY_A,
    }
    done = subprocess.run(
        [sys.executable, "-c", snippet], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    sandbox_id = done.stdout.strip()
    assert sandbox_id.startswith("sb-")
    assert Sandbox.kill(sandbox_id, **stack.sdk()) is False  # the snippet killed it


@pytest.mark.skipif(not KUBECTL.exists(), reason="needs the pinned kubectl (make kubectl)")
def test_kubectl_sees_e2b_sandboxes_and_deletes_them(
    stack: Stack, created: list[str], tmp_path: Path
) -> None:
    ca = kube_tls().cert_file.read_bytes()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", stack.kube_url, KUBE_TOKEN, ca)

    def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
        command = [str(KUBECTL), "--kubeconfig", str(kubeconfig)]
        command += ["--cache-dir", str(tmp_path / "cache"), *args]
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
        return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)

    sandbox = Sandbox.create(**stack.sdk(KEY_B))
    created.append(sandbox.sandbox_id)
    claim_id = next(i for i in stack.live_ids() if i.replace("_", "-") == sandbox.sandbox_id)

    def name_in(namespace: str) -> str | None:
        got = kubectl(
            "get", "sandboxes", "-n", namespace,
            "-o", "jsonpath={range .items[*]}{.metadata.name} "
            "{.metadata.annotations.sandbox\\.cocoonstack\\.io/claim-id}{'\\n'}{end}",
        )  # fmt: skip
        assert got.returncode == 0, got.stderr
        for line in got.stdout.splitlines():
            name, _, listed_id = line.partition(" ")
            if listed_id == sandbox.sandbox_id:  # the annotation spells it as the SDK does
                return name
        return None

    name = wait_until(lambda: name_in("team-b"), what="the e2b sandbox in kubectl get")
    assert name.startswith("e2b-")
    assert name_in("default") is None
    gone = kubectl("delete", "sandbox", name, "-n", "team-b", "--wait=false")
    assert gone.returncode == 0, gone.stderr

    def not_found() -> bool:
        try:
            Sandbox.get_info(sandbox.sandbox_id, **stack.sdk(KEY_B))
        except SandboxNotFoundException:
            return True
        return False

    wait_until(not_found, what="the SDK to see the sandbox gone")
    assert claim_id not in stack.live_ids()
    assert DOMAIN

"""Kubernetes list and watch semantics, read by the pinned kubectl (``make kubectl``) and
the official ``kubernetes`` Python client, against the API server over two real agents.

The stack is the one the kubectl tests use: two in-process host agents (bubblewrap
sandboxes) read by the mesh inventory source (``real_fleet``), and the Sandbox API app
over that store on a loopback port. The restart test starts what ``serve-apiserver`` runs
(its mesh source and store builder) twice on one port over the same agents. Sandboxes
are created and deleted through the API, so every change is this server's own write,
visible at once.

A sandbox created through the API is shown from the row the claim's answer carries, the
row its node's inventory later publishes, so the catch-up is no change: no MODIFIED.

Every watch is bounded by the server (``timeoutSeconds``) and every wait polls with a
deadline. Skipped without root or bubblewrap; the kubectl tests also without kubectl.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import urllib3
from kubernetes import config as kube_config
from kubernetes import watch
from kubernetes.client import ApiClient, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from sandboxctl.apiserver import create_kube_app, write_kubeconfig
from sandboxctl.cli.sources import mesh_source
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.core.model import PoolKey
from tests.apiserver.conftest import AGENTS_TOKEN
from tests.apiserver.helpers import (
    AUTH,
    KUBE_TOKEN,
    KUBE_TOKENS,
    Lines,
    kube_tls,
    serving,
    trusting,
)
from tests.sandboxd.servers import (
    free_port,
    sandboxes_unavailable,
    wait_until,
    write_token,
)
from tests.store.real_fleet import RealFleet

KUBECTL = Path(__file__).resolve().parents[2] / ".tools" / "bin" / "kubectl"
TOKEN = AGENTS_TOKEN
BASE = PoolKey("base")
GROUP, VERSION, PLURAL, NAMESPACE = "agents.x-k8s.io", "v1beta1", "sandboxes", "default"
COLLECTION = f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}"
WATCH_SECONDS = 10  # the server ends every watch of these tests by then

log = logging.getLogger("tests.apiserver.reads")

pytestmark = pytest.mark.skipif(
    sandboxes_unavailable() is not None, reason=str(sandboxes_unavailable())
)
needs_kubectl = pytest.mark.skipif(
    not KUBECTL.exists(), reason="needs the pinned kubectl in .tools/bin (make kubectl)"
)


def manifest(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": name, "annotations": {"sandbox.cocoonstack.io/ttl-seconds": "300"}},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "m", "image": "base"}]}}},
    }


def create(http: httpx.Client, name: str) -> dict[str, Any]:
    answer = http.post(COLLECTION, json=manifest(name))
    assert answer.status_code == 201, answer.text
    return answer.json()  # type: ignore[no-any-return]


def delete(http: httpx.Client, name: str) -> None:
    answer = http.delete(f"{COLLECTION}/{name}")
    assert answer.status_code == 200, answer.text


def names_of(listed: dict[str, Any]) -> list[str]:
    return [item["metadata"]["name"] for item in listed["items"]]


def client_for(stack: ExitStack, kubeconfig: Path) -> CustomObjectsApi:
    api_client: ApiClient = kube_config.new_client_from_config(config_file=str(kubeconfig))
    stack.callback(api_client.close)
    return CustomObjectsApi(api_client)


@dataclass
class Stack:
    fleet: RealFleet
    url: str
    kubeconfig: Path
    home: Path
    http: httpx.Client
    api: CustomObjectsApi

    def create(self, name: str) -> dict[str, Any]:
        return create(self.http, name)

    def delete(self, name: str) -> None:
        delete(self.http, name)

    def command(self, *args: str) -> list[str]:
        cache = str(self.home / "cache")
        return [str(KUBECTL), "--kubeconfig", str(self.kubeconfig), "--cache-dir", cache, *args]

    def env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", ""), "HOME": str(self.home)}

    def kubectl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(*args), capture_output=True, text=True, timeout=timeout, env=self.env()
        )

    @contextmanager
    def kubectl_running(self, *args: str) -> Iterator[tuple[Lines, Lines]]:
        """Run kubectl in the background; yields its stdout and stderr lines, and kills it
        at the end."""
        with subprocess.Popen(
            self.command(*args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env(),
        ) as process:
            assert process.stdout is not None
            assert process.stderr is not None
            out = Lines(iter(process.stdout.readline, ""), process.kill)
            log = Lines(iter(process.stderr.readline, ""), process.kill)
            try:
                yield out, log
            finally:
                out.close()

    def list(self, **kwargs: Any) -> dict[str, Any]:
        listed: dict[str, Any] = self.api.list_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, **kwargs
        )
        return listed


@pytest.fixture
def stack(agents: RealFleet, tmp_path: Path) -> Iterator[Stack]:
    with ExitStack() as stack:
        fleet = agents  # shared with test_kubectl, as fresh as a fleet of this test's own
        app = create_kube_app(fleet.store, KUBE_TOKENS, watch_interval=0.2)
        url = stack.enter_context(serving(app, tls=kube_tls()))
        ca = kube_tls().cert_file.read_bytes()
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url, KUBE_TOKEN, ca)
        http = stack.enter_context(
            httpx.Client(base_url=url, headers=AUTH, timeout=30, verify=trusting())
        )
        api = client_for(stack, kubeconfig)
        yield Stack(fleet, url, kubeconfig, tmp_path, http, api)


def watch_events(
    api: CustomObjectsApi,
    resource_version: str,
    done: Callable[[list[dict[str, Any]]], bool],
    timeout_seconds: int = WATCH_SECONDS,
) -> list[dict[str, Any]]:
    """Watch the namespace from ``resource_version`` until ``done(events)``; the server
    ends the watch after ``timeout_seconds`` if that never comes."""
    events: list[dict[str, Any]] = []
    stream = watch.Watch()
    for event in stream.stream(
        api.list_namespaced_custom_object,
        GROUP,
        VERSION,
        NAMESPACE,
        PLURAL,
        resource_version=resource_version,
        timeout_seconds=timeout_seconds,
        _request_timeout=(5, timeout_seconds + 10),
    ):
        events.append(event)
        if done(events):
            stream.stop()
            break
    return events


def typed(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["raw_object"]["metadata"]["name"]) for e in events]


def version_of(event: dict[str, Any]) -> int:
    return int(event["raw_object"]["metadata"]["resourceVersion"])


# --- kubectl -------------------------------------------------------------------------------


@needs_kubectl
def test_a_create_answers_the_object_the_next_get_and_list_show(stack: Stack) -> None:
    created = stack.create("same")
    got = stack.http.get(f"{COLLECTION}/same")
    assert got.status_code == 200, got.text
    assert created == got.json()  # one function makes both: resourceVersion included
    listed = stack.http.get(COLLECTION).json()["items"]
    assert [item for item in listed if item["metadata"]["name"] == "same"] == [created]
    assert "spec" not in created  # what the store shows, not the submitted object
    claim_id = created["metadata"]["annotations"]["sandbox.cocoonstack.io/claim-id"]
    assert created["status"]["nodeName"] in stack.fleet.agents
    assert claim_id.startswith("sb-")  # the SDK's spelling


def test_kubectl_watch_only_prints_only_sandboxes_created_after_it(stack: Stack) -> None:
    stack.create("before")
    watching = ("get", "sandboxes", "-w", "--watch-only", "--output-watch-events", "-v=6")
    with stack.kubectl_running(*watching) as (out, log):
        log.until(lambda line: "watch=true" in line, what="the watch request")
        stack.create("after")
        out.until(lambda line: line.split()[:2] == ["ADDED", "after"], what="'after' ADDED")
    # The existing sandbox is not listed, and the inventory catching up changes nothing.
    assert [line for line in out.seen if "before" in line.split()] == [], out.seen
    requests = [line for line in log.seen if f"/{PLURAL}?" in line]
    # kubectl lists to learn the version, then watches from it: no initial events asked for.
    assert any("watch=true" in line and "resourceVersion=" in line for line in requests)
    assert not any("sendInitialEvents" in line for line in requests), requests


@needs_kubectl
def test_kubectl_chunk_size_pages_through_every_sandbox(stack: Stack) -> None:
    names = [f"c{i}" for i in range(5)]
    for name in names:
        stack.create(name)

    result = stack.kubectl("get", "sandboxes", "--chunk-size=2", "-v=6")
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert header.split()[0] == "NAME"
    assert [row.split()[0] for row in rows] == names

    # kubectl's own log of its requests: a first page, then two continued ones.
    lists = [line for line in result.stderr.splitlines() if f"/{PLURAL}?" in line]
    first = [line for line in lists if "limit=2" in line and "continue=" not in line]
    continued = [line for line in lists if "limit=2" in line and "continue=" in line]
    assert (len(first), len(continued)) == (1, 2), result.stderr

    # The same pages over the API: two, two and one, the last with no continue token.
    page = stack.http.get(COLLECTION, params={"limit": 2}).json()
    assert names_of(page) == names[:2]
    assert page["metadata"]["continue"]
    version = page["metadata"]["resourceVersion"]
    seen = names_of(page)
    while page["metadata"].get("continue"):
        params = {"limit": 2, "continue": page["metadata"]["continue"]}
        page = stack.http.get(COLLECTION, params=params).json()
        assert page["metadata"]["resourceVersion"] == version  # one state throughout
        seen += names_of(page)
    assert seen == names


@needs_kubectl
def test_kubectl_watch_sees_a_sandbox_deleted_30ms_after_its_create(stack: Stack) -> None:
    watching = ("get", "sandboxes", "-w", "--output-watch-events", "-v=6")
    with stack.kubectl_running(*watching) as (out, log):
        log.until(lambda line: "watch=true" in line, what="the watch request")
        stack.create("brief")
        time.sleep(0.03)  # the scenario, not a wait: well within one inventory poll (0.2 s)
        stack.delete("brief")
        out.until(lambda line: line.split()[:2] == ["ADDED", "brief"], what="brief ADDED")
        out.until(lambda line: line.split()[:2] == ["DELETED", "brief"], what="brief DELETED")
    assert out.seen[0].split()[:2] == ["EVENT", "NAME"]


# --- the official client -------------------------------------------------------------


def test_client_watch_from_a_list_version_gets_only_later_changes(stack: Stack) -> None:
    stack.create("old")
    listed = stack.list()
    assert names_of(listed) == ["old"]
    version = listed["metadata"]["resourceVersion"]

    stack.create("new")
    stack.delete("new")
    stack.delete("old")
    events = watch_events(stack.api, version, lambda seen: ("DELETED", "old") in typed(seen[-1:]))
    assert typed(events) == [("ADDED", "new"), ("DELETED", "new"), ("DELETED", "old")]
    versions = [version_of(event) for event in events]
    assert int(version) < versions[0]
    assert versions == sorted(set(versions))  # in order, each change its own version


def test_client_gets_410_for_a_too_old_version_and_a_relist_recovers(stack: Stack) -> None:
    stack.create("kept")
    listed = stack.list()
    version = int(listed["metadata"]["resourceVersion"])

    # v37 with timeout_seconds does not retry: the in-stream ERROR (HTTP 200, Status 410)
    # is raised at once as an ApiException, before any event is yielded.
    yielded: list[dict[str, Any]] = []
    with pytest.raises(ApiException) as gone:
        yielded = watch_events(stack.api, "1", lambda seen: True)
    assert yielded == []
    assert gone.value.status == 410
    assert str(gone.value.reason).startswith("Expired: ")

    # A list at a version newer than any this server gave is 410 too (a Status body).
    with pytest.raises(ApiException) as ahead:
        stack.list(resource_version=str(version + 1_000_000))
    assert ahead.value.status == 410
    status = json.loads(ahead.value.body)
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")

    # The relist: the current objects and a version a watch resumes from.
    relisted = stack.list()
    assert names_of(relisted) == ["kept"]
    assert int(relisted["metadata"]["resourceVersion"]) >= version
    stack.create("later")
    events = watch_events(
        stack.api,
        relisted["metadata"]["resourceVersion"],
        lambda seen: ("ADDED", "later") in typed(seen),
    )
    assert typed(events) == [("ADDED", "later")]


def test_client_pages_return_every_object_once_from_one_state(stack: Stack) -> None:
    names = [f"p{i}" for i in range(5)]
    for name in names:
        stack.create(name)

    pages = [stack.list(limit=2)]
    stack.create("p9")  # changes between pages do not show in them
    stack.delete("p0")
    while token := pages[-1]["metadata"].get("continue"):
        pages.append(stack.list(limit=2, _continue=token))
    assert [len(page["items"]) for page in pages] == [2, 2, 1]
    assert [name for page in pages for name in names_of(page)] == names
    assert len({page["metadata"]["resourceVersion"] for page in pages}) == 1

    assert names_of(stack.list()) == [*names[1:], "p9"]


# --- an informer over a restart of the API server ---------------------------------------


class Informer:
    """A list-then-watch loop as client-go's reflector runs it, with the official client:
    list, watch from the list's version, re-watch from the last event's version when a
    watch ends or the connection fails, relist on 410."""

    def __init__(self, api: CustomObjectsApi) -> None:
        self.api = api
        self.cache: dict[str, dict[str, Any]] = {}
        self.cursor: str | None = None
        self.listed_at: list[int] = []  # the version of every list
        self.seen: list[int] = []  # the version of every event, in order
        self.expired = 0  # 410s
        self.failures: list[BaseException] = []  # any other error
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread = threading.Thread(target=self._run, name="informer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            if self._watch is not None:
                self._watch.stop()
        self._thread.join(timeout=WATCH_SECONDS + 5)
        assert not self._thread.is_alive(), "the informer did not stop"

    def versions(self) -> dict[str, str]:
        """name -> resourceVersion of every cached object."""
        with self._lock:
            return {name: obj["metadata"]["resourceVersion"] for name, obj in self.cache.items()}

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.cursor is None:
                    self._relist()
                self._watch_from_cursor()
            except ApiException as error:
                if error.status == 410:
                    self.expired += 1
                    self.cursor = None  # relist
                else:
                    self.failures.append(error)
                    self._stop.wait(0.05)
            except urllib3.exceptions.HTTPError:  # refused, reset or timed out: re-watch
                self._stop.wait(0.05)
            except Exception as error:  # a bug in the test or the client: visible, not fatal
                self.failures.append(error)
                self._stop.wait(0.05)

    def _relist(self) -> None:
        listed = self.api.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)
        version = listed["metadata"]["resourceVersion"]
        with self._lock:
            self.cache = {item["metadata"]["name"]: item for item in listed["items"]}
        self.listed_at.append(int(version))
        self.cursor = version

    def _watch_from_cursor(self) -> None:
        stream = watch.Watch()
        with self._lock:
            self._watch = stream
        for event in stream.stream(
            self.api.list_namespaced_custom_object,
            GROUP,
            VERSION,
            NAMESPACE,
            PLURAL,
            resource_version=self.cursor,
            allow_watch_bookmarks=True,
            timeout_seconds=3,  # short, so the re-watch from the cursor runs too
            _request_timeout=(2, 15),
        ):
            obj = event["raw_object"]
            self.cursor = obj["metadata"]["resourceVersion"]
            self.seen.append(int(self.cursor))
            if event["type"] != "BOOKMARK":
                with self._lock:
                    if event["type"] == "DELETED":
                        self.cache.pop(obj["metadata"]["name"], None)
                    else:
                        self.cache[obj["metadata"]["name"]] = obj
            if self._stop.is_set():
                break


@contextmanager
def apiserver(fleet: RealFleet, port: int, token_file: Path) -> Iterator[str]:
    """What ``serve-apiserver`` runs, over the fleet's agents, served on ``port`` until the
    end: the same mesh source and store builder, so each call starts from nothing (a new
    inventory poll, a new ledger and its versions), as a new process would. Open watches
    end when it stops, as they do on serve-apiserver's shutdown. Yields its URL."""
    seeds = ",".join(agent.settings.advertise_addr for agent in fleet.agents.values())
    mesh = mesh_source("mesh", seeds, token_file, timedelta(seconds=0.2), log)
    stopping = threading.Event()
    with mesh.store(FreshnessRule()) as store:
        app = create_kube_app(store, KUBE_TOKENS, watch_interval=0.2, stopping=stopping.is_set)
        with serving(app, port) as url:
            try:
                yield url
            finally:
                stopping.set()


def test_an_informer_keeps_an_accurate_cache_over_an_apiserver_restart(
    stack: Stack, tmp_path: Path
) -> None:
    port = free_port()
    token_file = write_token(tmp_path / "token", TOKEN)
    url = f"http://127.0.0.1:{port}"
    with ExitStack() as resources:
        config = write_kubeconfig(tmp_path / "restart-kubeconfig", url, KUBE_TOKEN)
        api = client_for(resources, config)
        http = resources.enter_context(httpx.Client(base_url=url, headers=AUTH, timeout=30))
        informer = Informer(api)
        resources.callback(informer.stop)

        def accurate() -> bool:
            listed = http.get(COLLECTION).json()
            return informer.versions() == {
                item["metadata"]["name"]: item["metadata"]["resourceVersion"]
                for item in listed["items"]
            }

        with apiserver(stack.fleet, port, token_file):
            create(http, "r1")
            informer.start()
            wait_until(lambda: set(informer.versions()) == {"r1"}, what="the first list")
            create(http, "r2")
            wait_until(lambda: set(informer.versions()) == {"r1", "r2"}, what="r2 watched")
            wait_until(accurate, what="the cache to match the first server's list")
            before = max([*informer.seen, *informer.listed_at])
            watched = len(informer.seen)
            assert len(informer.listed_at) == 1

        # While no API server runs, the fleet changes (as through another replica).
        stack.fleet.store.claim(NAMESPACE, "r3", BASE, ttl_seconds=300)
        released = stack.fleet.store.locate(NAMESPACE, "r1")
        assert released is not None
        stack.fleet.store.release(released)

        with apiserver(stack.fleet, port, token_file):
            # The old version is one this server never gave: 410, and the loop relists.
            wait_until(
                lambda: set(informer.versions()) == {"r2", "r3"}, what="the relist after 410"
            )
            assert informer.expired == 1
            assert len(informer.listed_at) == 2
            assert informer.listed_at[1] > before  # every version of the new server is larger
            create(http, "r4")
            delete(http, "r2")
            wait_until(lambda: set(informer.versions()) == {"r3", "r4"}, what="r4 and r2 watched")
            wait_until(accurate, what="the cache to match the new server's list")
            assert all(version > before for version in informer.seen[watched:])

        assert informer.failures == []


# --- bad input, over plain HTTP ------------------------------------------------------------


def assert_bad_request(answer: httpx.Response, *words: str) -> dict[str, Any]:
    assert answer.status_code == 400, answer.text
    status: dict[str, Any] = answer.json()
    assert (status["kind"], status["status"], status["code"]) == ("Status", "Failure", 400)
    assert status["reason"] == "BadRequest"
    for word in words:
        assert word in status["message"], status
    return status


def test_bad_read_parameters_are_400_status(stack: Stack) -> None:
    http = stack.http
    for params in (
        {"resourceVersion": "abc"},
        {"resourceVersion": "12x", "watch": "true", "timeoutSeconds": "5"},
    ):
        status = assert_bad_request(http.get(COLLECTION, params=params), "resourceVersion")
        [cause] = status["details"]["causes"]
        assert cause["field"] == "resourceVersion"

    current = http.get(COLLECTION).json()["metadata"]["resourceVersion"]
    bogus = {"resourceVersion": current, "resourceVersionMatch": "Bogus"}
    status = assert_bad_request(http.get(COLLECTION, params=bogus), "resourceVersionMatch")
    assert status["details"]["causes"][0]["field"] == "resourceVersionMatch"

    stack.create("t1")
    stack.create("t2")
    token = http.get(COLLECTION, params={"limit": 1}).json()["metadata"]["continue"]
    body = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    rewritten = base64.urlsafe_b64encode(json.dumps({"v": body["v"]}).encode()).decode()
    for tampered in ("f" + token[1:], token[:-4], rewritten, "not-a-token"):
        answer = http.get(COLLECTION, params={"limit": 1, "continue": tampered})
        assert_bad_request(answer, "continue")
    # The untouched token still reads the next page.
    following = http.get(COLLECTION, params={"limit": 1, "continue": token}).json()
    assert names_of(following) == ["t2"]

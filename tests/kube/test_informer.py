"""The informer against the real control plane: list then watch, an ended watch (and on
the double, a cut one), 410 after a compaction then relist, a restart of kube-apiserver,
selectors, resync, and a cache read without API calls."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from kubernetes import client

from sandboxctl.kube import NODE_INVENTORIES, CustomObjects, Informer
from sandboxctl.kube.informer import metadata_only
from tests.sandboxd.servers import wait_until
from tests.testing.kubeapi.double import Kube
from tests.testing.realkube import RealKube

NI = ("sandbox.cocoonstack.io", "v1beta1", "nodeinventories")


def inventory(
    name: str, labels: dict[str, str] | None = None, address: str = "a:1"
) -> dict[str, Any]:
    return {
        "apiVersion": f"{NI[0]}/{NI[1]}",
        "kind": "NodeInventory",
        "metadata": {"name": name, "labels": labels or {}},
        "node": name,
        "address": address,
    }


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, kind: str, obj: dict[str, Any]) -> None:
        with self._lock:
            self.events.append((kind, obj["metadata"]["name"]))

    def saw(self, *wanted: tuple[str, str]) -> bool:
        with self._lock:
            return all(w in self.events for w in wanted)


@pytest.fixture
def started(kube: Kube) -> Iterator[tuple[Informer, Recorder, client.CustomObjectsApi]]:
    objects = client.CustomObjectsApi(kube.api)
    objects.create_cluster_custom_object(*NI, inventory("n1"))
    recorder = Recorder()
    informer = Informer(
        CustomObjects(kube.api, NODE_INVENTORIES),
        recorder,
        watch_seconds=5,
        backoff_initial=0.05,
        backoff_max=0.2,
    )
    informer.start()
    assert informer.wait_synced(10)
    yield informer, recorder, objects
    informer.stop()


def test_lists_then_follows_the_watch(
    started: tuple[Informer, Recorder, client.CustomObjectsApi],
) -> None:
    informer, recorder, objects = started
    assert recorder.events == [("ADDED", "n1")]
    objects.create_cluster_custom_object(*NI, inventory("n2"))
    objects.patch_cluster_custom_object(*NI, "n1", {"address": "b:2"})
    objects.delete_cluster_custom_object(*NI, "n2")
    wait_until(lambda: recorder.saw(("DELETED", "n2")), what="the delete to arrive")
    assert recorder.events == [
        ("ADDED", "n1"),
        ("ADDED", "n2"),
        ("MODIFIED", "n1"),
        ("DELETED", "n2"),
    ]
    cached = informer.get("n1")
    assert cached is not None
    assert cached["address"] == "b:2"
    assert informer.get("n2") is None
    assert informer.stats.lists == 1


def test_an_ended_watch_resumes_from_its_cursor(kube: Kube) -> None:
    objects = client.CustomObjectsApi(kube.api)
    objects.create_cluster_custom_object(*NI, inventory("n1"))
    recorder = Recorder()
    informer = Informer(CustomObjects(kube.api, NODE_INVENTORIES), recorder, watch_seconds=1)
    informer.start()
    try:
        assert informer.wait_synced(10)
        watches = informer.stats.watches
        wait_until(lambda: informer.stats.watches > watches, what="kube-apiserver to end a watch")
        objects.create_cluster_custom_object(*NI, inventory("n3"))
        wait_until(lambda: recorder.saw(("ADDED", "n3")), what="the event after the end")
        assert informer.stats.lists == 1  # no relist: the cursor was still good
    finally:
        informer.stop()


def test_a_watch_cut_without_a_word_resumes_from_its_cursor(double_kube: Kube) -> None:
    """On the double: it cuts every watch's connection with no end of stream, as a load
    balancer between a client and kube-apiserver may; kube-apiserver itself ends a watch
    only at its timeout or at shutdown."""
    kube = double_kube
    objects = client.CustomObjectsApi(kube.api)
    objects.create_cluster_custom_object(*NI, inventory("n1"))
    recorder = Recorder()
    informer = Informer(
        CustomObjects(kube.api, NODE_INVENTORIES), recorder, watch_seconds=5,
        backoff_initial=0.05, backoff_max=0.2,
    )  # fmt: skip
    informer.start()
    try:
        assert informer.wait_synced(10)
        watches = informer.stats.watches
        httpx.post(f"{kube.url}/_fake/drop-watches")
        objects.create_cluster_custom_object(*NI, inventory("n3"))
        wait_until(lambda: recorder.saw(("ADDED", "n3")), what="the event after the drop")
        assert informer.stats.watches > watches
        assert informer.stats.lists == 1
    finally:
        informer.stop()


def test_410_after_a_compaction_relists_and_diffs(uncached_kube: RealKube) -> None:
    plane = uncached_kube.plane
    objects = client.CustomObjectsApi(uncached_kube.api)
    for name in ("n1", "n2", "n3"):
        objects.create_cluster_custom_object(*NI, inventory(name))
    recorder = Recorder()
    informer = Informer(
        CustomObjects(uncached_kube.api, NODE_INVENTORIES), recorder, watch_seconds=5,
        backoff_initial=0.05, backoff_max=0.2,
    )  # fmt: skip
    informer.start()
    try:
        assert informer.wait_synced(10)
        # While the informer cannot watch, n2 and n3 go (written to etcd by another replica,
        # as it were) and etcd is compacted past the informer's cursor. (Two: a compaction
        # keeps the newest revision, and a watch whose next event is a delete whose old
        # value is compacted gets 500 from kube-apiserver, not 410.)
        plane.stop_apiserver()
        wait_until(lambda: informer.stats.failures >= 1, what="the informer to see the outage")
        for name in ("n2", "n3"):
            assert plane.delete_from_etcd(f"/registry/{NI[0]}/{NI[2]}/{name}") == 1
        plane.compact()
        plane.start_apiserver()
        wait_until(lambda: informer.stats.lists == 2, timeout=30, what="the relist after 410")
        wait_until(
            lambda: recorder.saw(("DELETED", "n2"), ("DELETED", "n3")), what="the relist's diff"
        )
        assert informer.stats.expired == 1
        assert [i["metadata"]["name"] for i in informer.items()] == ["n1"]
    finally:
        informer.stop()


def test_keep_caches_only_what_it_returns_and_the_handler_gets_the_whole(kube: Kube) -> None:
    objects = client.CustomObjectsApi(kube.api)
    objects.create_cluster_custom_object(*NI, inventory("n1"))
    seen: list[dict[str, Any]] = []
    informer = Informer(
        CustomObjects(kube.api, NODE_INVENTORIES),
        lambda kind, obj: seen.append(obj),
        keep=metadata_only,
        watch_seconds=5,
    )
    informer.start()
    try:
        assert informer.wait_synced(10)
        objects.patch_cluster_custom_object(*NI, "n1", {"address": "b:2"})
        wait_until(lambda: len(seen) == 2, what="the list's object and the change")
        assert [obj["address"] for obj in seen] == ["a:1", "b:2"]
        cached = informer.get("n1")
        assert cached is not None
        assert set(cached) == {"metadata"}
        assert cached["metadata"]["resourceVersion"] == seen[1]["metadata"]["resourceVersion"]
    finally:
        informer.stop()


def test_a_label_selector_sees_an_object_leave(kube: Kube) -> None:
    objects = client.CustomObjectsApi(kube.api)
    objects.create_cluster_custom_object(*NI, inventory("n1", {"pool": "a"}))
    recorder = Recorder()
    informer = Informer(
        CustomObjects(kube.api, NODE_INVENTORIES),
        recorder,
        label_selector="pool=a",
        watch_seconds=5,
    )
    informer.start()
    try:
        assert informer.wait_synced(10)
        objects.patch_cluster_custom_object(*NI, "n1", {"metadata": {"labels": {"pool": "b"}}})
        wait_until(lambda: recorder.saw(("DELETED", "n1")), what="n1 to leave the selector")
        assert informer.items() == []
    finally:
        informer.stop()


def test_resync_redelivers_the_cache(kube: Kube) -> None:
    client.CustomObjectsApi(kube.api).create_cluster_custom_object(*NI, inventory("n1"))
    recorder = Recorder()
    informer = Informer(
        CustomObjects(kube.api, NODE_INVENTORIES), recorder, resync=timedelta(seconds=0.1)
    )
    informer.start()
    try:
        wait_until(lambda: recorder.events.count(("SYNC", "n1")) >= 2, what="two resyncs")
        assert informer.stats.lists == 1  # from the cache, not the API
    finally:
        informer.stop()


def test_survives_a_restart_of_the_api_server(kube: RealKube) -> None:
    plane = kube.plane
    api = kube.api
    objects = client.CustomObjectsApi(api)
    objects.create_cluster_custom_object(*NI, inventory("n1"))
    recorder = Recorder()
    informer = Informer(
        CustomObjects(api, NODE_INVENTORIES),
        recorder,
        watch_seconds=5,
        backoff_initial=0.05,
        backoff_max=0.5,
    )
    informer.start()
    try:
        assert informer.wait_synced(10)
        plane.stop_apiserver()
        wait_until(lambda: informer.stats.failures >= 1, what="the informer to notice the outage")
        assert informer.get("n1") is not None  # reads go on from the cache
        plane.start_apiserver()
        objects.create_cluster_custom_object(*NI, inventory("n2"))
        wait_until(
            lambda: recorder.saw(("ADDED", "n2")), timeout=20, what="an event after the restart"
        )
        assert {i["metadata"]["name"] for i in informer.items()} == {"n1", "n2"}
    finally:
        informer.stop()

"""Fixtures for the guard's tests: ``real_cluster``, the real control plane (``real_kube``)
with the guard's helpers; and, for the tests that need what only a double can give (its
request log, its fault injection), the API double with Karpenter's CRDs registered, a
request log to count what the guard sends, and reconcilers on real informers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxctl.lanes.guardkit import KARPENTER_CRDS
from sandboxctl_testing.kubeapi import start
from tests.guard.cluster import Cluster
from tests.guard.realcluster import RealCluster
from tests.testing.kubeapi.double import CRDS, Kube, api_for, write_kubeconfig
from tests.testing.realkube import RealKube


@pytest.fixture
def real_cluster(real_kube: RealKube) -> Iterator[RealCluster]:
    """The guard's helpers on the shared real control plane, put back after the test."""
    made = RealCluster(real_kube)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[Kube]:
    running = start(0, crds=[CRDS, KARPENTER_CRDS], bookmark_seconds=0.2)
    running.server.settings.request_log = tmp_path / "requests.jsonl"
    api = api_for(running.url)
    try:
        yield Kube(running, write_kubeconfig(tmp_path / "kubeconfig", running.url), api)
    finally:
        api.close()
        running.stop()


@pytest.fixture
def cluster(kube: Kube, tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(kube, tmp_path / "requests.jsonl")
    try:
        yield made
    finally:
        made.close()


def requests(log: Path) -> list[dict[str, str]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]

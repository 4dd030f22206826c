"""The double's own tests run on the double; its conformance suite runs each scenario on the
double and on the real control plane, so that the two cannot disagree unnoticed."""

from __future__ import annotations

import pytest

from tests.testing.kubeapi.double import Kube, double_kube  # noqa: F401
from tests.testing.realkube import RealKube

BACKENDS = ("double", "real")


@pytest.fixture(params=BACKENDS)
def kube(request: pytest.FixtureRequest) -> Kube | RealKube:
    fixture = "double_kube" if request.param == "double" else "real_kube"
    backend: Kube | RealKube = request.getfixturevalue(fixture)
    return backend

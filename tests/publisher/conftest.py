"""Fixtures for the publisher's tests: the real control plane, and the double for the
faults only it can answer on demand."""

from tests.testing.kubeapi.double import double_kube  # noqa: F401
from tests.testing.realkube import kube  # noqa: F401

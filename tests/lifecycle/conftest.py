"""Fixtures for the process manager's tests: the Kubernetes API double in this process."""

from tests.testing.kubeapi.double import kube  # noqa: F401

"""Fixtures for the process manager's tests: the Kubernetes API double in this process."""

from tests.testing.kubeapi.double import double_kube as kube  # noqa: F401  (not moved yet)

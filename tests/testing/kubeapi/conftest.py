"""Fixtures for the Kubernetes tests: the API double in this process."""

from tests.testing.kubeapi.double import double_kube as kube  # noqa: F401  (not moved yet)

"""Fixtures for the Kubernetes tests: the API double in this process."""

from tests.testing.kubeapi.double import kube  # noqa: F401

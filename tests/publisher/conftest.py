"""Fixtures for the Kubernetes tests: the API double in this process."""

from tests.kubeapi.double import kube  # noqa: F401

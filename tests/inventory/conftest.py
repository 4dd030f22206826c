"""Fixtures for the inventory tests: the Kubernetes API double in this process."""

from tests.testing.realkube import kube  # noqa: F401

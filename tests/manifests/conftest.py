"""Fixtures for the manifests' tests: the real control plane."""

from tests.testing.realkube import kube  # noqa: F401

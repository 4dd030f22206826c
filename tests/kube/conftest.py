"""Fixtures for the Kubernetes tests: the API double in this process, the CLI in-process."""

from tests.cli.conftest import run  # noqa: F401
from tests.testing.kubeapi.double import double_kube as kube  # noqa: F401  (not moved yet)

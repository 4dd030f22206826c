"""Fixtures for the Kubernetes tests: the real control plane (the double for what only it
can do), the CLI in-process."""

from tests.cli.conftest import run  # noqa: F401
from tests.testing.kubeapi.double import double_kube  # noqa: F401
from tests.testing.realkube import kube  # noqa: F401

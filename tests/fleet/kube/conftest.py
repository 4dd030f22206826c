"""The kube fleet fixture: the real control plane, agents, publishers and servers as
processes."""

from tests.fleet.kube.fleet import kube_fleet  # noqa: F401
from tests.testing.realkube import kube  # noqa: F401

"""The kube fleet fixture: the double, agents, publishers and servers as processes."""

from tests.fleet.kube.fleet import kube_fleet  # noqa: F401
from tests.testing.kubeapi.double import double_kube as kube  # noqa: F401  (not moved yet)

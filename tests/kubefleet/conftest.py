"""The kube fleet fixture: the double, agents, publishers and servers as processes."""

from tests.kubeapi.double import kube  # noqa: F401
from tests.kubefleet.fleet import kube_fleet  # noqa: F401

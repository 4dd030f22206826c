"""``sandboxctl publish``: one host's NodeInventory, read from its agent and server-side
applied to Kubernetes every interval, with ``publishedAt``.

Modules: ``publish`` (one publish and the loop), ``metrics`` (its own ``/metrics``).
"""

from sandboxctl.publisher.metrics import PublishMetrics
from sandboxctl.publisher.publish import (
    FIELD_MANAGER,
    Outcome,
    Publisher,
    published_object,
)

__all__ = ["FIELD_MANAGER", "Outcome", "PublishMetrics", "Publisher", "published_object"]

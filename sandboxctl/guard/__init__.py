"""``guard-workers``: keep Karpenter from voluntarily draining nodes under busy workers,
bounded by the NodePool's ``terminationGracePeriod``, and audit the NodePools that bound
it (docs/guard-workers.md).

Pure decisions (no I/O, clocks passed in; an import contract keeps them so):
``pods`` (views of pods and nodes), ``decide`` (the reconcile rule), ``health`` (the
drain guard for Terminating workers and ``is_schedulable``), ``audit`` (the NodePool
rules), ``settings``, ``status`` (the GuardStatus document).

I/O: ``busy``, ``sessions``, ``probe`` and ``hosts`` (the busy sources), ``reconcile``
(the tick and its patches), ``adopt`` (the conditional relabel), ``clear`` (uninstall),
``karpenter`` (reading the audit's input), ``metrics``, ``serve`` (``/metrics``,
``/status``) and ``service`` (``guard-workers run`` assembled). The calls on pods, nodes
and Karpenter's kinds are the Kubernetes layer's (``sandboxctl.kube``).
"""

# Only the pure parts are re-exported: importing the package must not load the
# Kubernetes client (the CLI's other verbs would pay for it). I/O lives in its modules:
# ``guard.service.Guard``, ``guard.reconcile.Reconciler``, ``guard.adopt.adopt``...
from sandboxctl.guard.decide import Busy, Memory, Rules, decide
from sandboxctl.guard.health import (
    Deferred,
    Healthy,
    Lost,
    LostReason,
    is_schedulable,
    is_terminating,
    judge,
    should_defer_lost,
)
from sandboxctl.guard.pods import ANNOTATION, DISRUPTED_TAINT, OVERRIDE_LABEL, PodView, pod_view

__all__ = [
    "ANNOTATION",
    "DISRUPTED_TAINT",
    "OVERRIDE_LABEL",
    "Busy",
    "Deferred",
    "Healthy",
    "Lost",
    "LostReason",
    "Memory",
    "PodView",
    "Rules",
    "decide",
    "is_schedulable",
    "is_terminating",
    "judge",
    "pod_view",
    "should_defer_lost",
]

"""The API servers over the one sandbox store.

Modules: ``kube`` (the Kubernetes-style ``sandboxes.agents.x-k8s.io`` API as a FastAPI
app), ``discovery`` (its discovery documents), ``tables`` (the Table form kubectl prints),
``creation`` (what a create claims; the answer is the read's object), ``status`` (Status error
bodies and the error table), ``kubeconfig`` (a kubeconfig pointing kubectl at it).
"""

from sandboxctl.apiserver.kube import create_kube_app
from sandboxctl.apiserver.kubeconfig import write_kubeconfig

__all__ = ["create_kube_app", "write_kubeconfig"]

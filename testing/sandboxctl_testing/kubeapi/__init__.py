"""A Kubernetes API server double, for tests and test lanes: no cluster runs here.

Run it as a process (``python -m sandboxctl_testing.kubeapi --port N --state FILE``) or
in-process (:func:`start`). It serves, over plain HTTP, what sandboxctl's code, kubectl
(1.32, 1.35) and the official ``kubernetes`` client use:

* discovery, a minimal OpenAPI v3 and Table answers (printer columns from CRDs);
* one global resourceVersion; list, get, create, update (PUT), delete, deletecollection;
* watches from a version, with bookmarks, the WatchList initial-events-end bookmark,
  selector transitions (an object leaving a selector is DELETED) and 410 Expired for a
  version older than the event log;
* 409 on a stale resourceVersion (PUT, patch, delete preconditions);
* label and field selectors (``metadata.name``, ``metadata.namespace``; for pods also
  ``spec.nodeName`` and ``status.phase``);
* merge, strategic-merge (read as merge) and JSON patches, and server-side apply with field
  managers (``managed``: per-manager ownership, conflicts, ``force``, removal of fields a
  manager stops applying; lists are atomic);
* the status subresource; deletion with finalizers, and a pod's grace period;
* CustomResourceDefinitions, from ``--crds DIR`` at start or created through the API,
  with their structural schemas enforced (pruning, ``fieldValidation=Strict``, types);
  built-in kinds are read back through the official client's models (422 otherwise);
* Leases, TokenReview and SubjectAccessReview (``access``: static tokens, RBAC evaluated
  over the stored roles and bindings; a request with a token is authorized the same way);
* ``dryRun=All`` on every write;
* a state file: objects and the resourceVersion survive a stop and a start (the event log
  does not, so a watch from before the restart gets 410, as after etcd compaction).

Hooks (``POST /_fake/...``): ``compact`` (forget the event log and expire every watch),
``expire`` (ERROR 410 to every watch), ``drop-watches`` (cut every watch's connection
without a word), ``fail`` (``{"method","path","status","count"}``: the next matching
requests answer that status), ``flush`` (write the state file now).

Not emulated: admission webhooks, defaulting, aggregated discovery, protobuf, paging
(``limit`` is ignored), namespace lifecycle (any namespace exists), garbage collection,
list merge keys in patches, and kube-apiserver's aggregation layer.
"""

from __future__ import annotations

from sandboxctl_testing.kubeapi.runner import Running, start

__all__ = ["Running", "start"]

"""The double's object store: one global resourceVersion, an event log for watches,
optimistic concurrency, field ownership, the status subresource, deletion with finalizers
and grace, CRD registration, and the state file that lets it stop and start again.

Every stored dict is replaced, never changed in place, so a reader holding one (a watch
encoding an event) never sees it move. One ``threading.Condition`` guards everything;
writers notify it, watches wait on it.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import re
import secrets
import tempfile
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kubernetes.client import ApiClient
from pydantic import ValidationError

from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.selectors import FieldSelector, LabelSelector
from sandboxctl.core.timestamps import format_rfc3339, parse_rfc3339
from sandboxctl_testing.kubeapi import managed
from sandboxctl_testing.kubeapi.patches import (
    APPLY,
    JSON_PATCH,
    PatchError,
    clone,
    json_patch,
    merge_patch,
)
from sandboxctl_testing.kubeapi.resources import CRDS, Registry, ResourceType
from sandboxctl_testing.kubeapi.schemas import SchemaError, admit, crd_resources, established

log = logging.getLogger(__name__)

DEFAULT_HISTORY = 10_000
FLUSH_SECONDS = 0.2
CONFLICT = (
    "the object has been modified; please apply your changes to the latest version and try again"
)
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"
_models = ApiClient()

Key = tuple[str, str]  # (namespace or "", name)


class ApiError(Exception):
    """A Status answer: ``code``, ``reason``, ``message`` and optional details."""

    def __init__(
        self, code: int, reason: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}


def not_found(resource: ResourceType, name: str) -> ApiError:
    return ApiError(
        404, "NotFound", f'{resource.qualified} "{name}" not found', _details(resource, name)
    )


def conflict(resource: ResourceType, name: str, why: str = CONFLICT) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {resource.qualified} "{name}": {why}',
        _details(resource, name),
    )


def invalid(resource: ResourceType, name: str, field_path: str, problem: str) -> ApiError:
    message = f'{resource.kind}.{resource.group} "{name}" is invalid: {field_path}: {problem}'
    details = {**_details(resource, name), "kind": resource.kind}
    details["causes"] = [{"reason": "FieldValueInvalid", "message": problem, "field": field_path}]
    return ApiError(422, "Invalid", message, details)


def _details(resource: ResourceType, name: str) -> dict[str, Any]:
    return {"name": name, "group": resource.group, "kind": resource.plural}


@dataclass
class Event:
    rv: int
    storage: tuple[str, str]
    namespace: str
    type: str  # ADDED, MODIFIED, DELETED
    old: dict[str, Any] | None
    new: dict[str, Any]
    encoded: dict[str, bytes] = field(default_factory=dict)  # api version -> JSON object


@dataclass
class Write:
    """What a write answers: the object, whether it was created, and warnings."""

    obj: dict[str, Any]
    created: bool = False
    warnings: list[str] = field(default_factory=list)


class Store:
    def __init__(
        self,
        registry: Registry | None = None,
        *,
        history: int = DEFAULT_HISTORY,
        state: Path | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.registry = registry or Registry()
        self.history = history
        self.state = state
        self._now = now
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.rv = 1
        self.compacted = 0  # a watch from a version below this gets 410
        self.expired = 0  # bumped to end every open watch with 410
        self.dropped = 0  # bumped to cut every open watch without a word
        self.closed = False
        self._objects: dict[tuple[str, str], dict[Key, dict[str, Any]]] = {}
        self._events: list[Event] = []
        self._rvs: list[int] = []
        self._dirty = False
        self._flusher: threading.Thread | None = None
        if state is not None and state.exists():
            self._load(state)
            self.compacted = self.rv  # the event log does not survive a restart
        self._seed()

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the background work: the state flusher and the grace-period reaper."""
        self._flusher = threading.Thread(target=self._background, name="kubeapi-store", daemon=True)
        self._flusher.start()

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self.changed.notify_all()
        if self._flusher is not None:
            self._flusher.join(timeout=10)
        self.flush()

    def _background(self) -> None:
        while True:
            with self.lock:
                self.changed.wait(FLUSH_SECONDS)
                if self.closed:
                    return
                self._reap()
            self.flush()

    # --- reads ----------------------------------------------------------------------------

    def now(self) -> str:
        return format_rfc3339(self._now())

    def get(self, resource: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        with self.lock:
            obj = self._objects.get(resource.storage, {}).get((namespace, name))
            if obj is None:
                raise not_found(resource, name)
            return _presented(resource, obj)

    def exists(self, resource: ResourceType, namespace: str, name: str) -> bool:
        with self.lock:
            return (namespace, name) in self._objects.get(resource.storage, {})

    def select(
        self, resource: ResourceType, namespace: str, labels: str = "", fields: str = ""
    ) -> tuple[list[dict[str, Any]], int]:
        matcher = self.matcher(resource, labels, fields)
        with self.lock:
            items = [
                _presented(resource, obj)
                for (ns, _), obj in sorted(self._objects.get(resource.storage, {}).items())
                if (not namespace or ns == namespace) and matcher(obj)
            ]
            return items, self.rv

    def all(self, storage: tuple[str, str]) -> list[dict[str, Any]]:
        with self.lock:
            return list(self._objects.get(storage, {}).values())

    def matcher(
        self, resource: ResourceType, labels: str, fields: str
    ) -> Callable[[dict[str, Any]], bool]:
        try:
            label_selector = LabelSelector.parse(labels)
            field_selector = FieldSelector.parse(
                fields, allowed=resource.fields, resource=resource.plural
            )
        except InvalidValueError as error:
            raise ApiError(400, "BadRequest", str(error)) from None

        def matches(obj: dict[str, Any]) -> bool:
            meta = obj.get("metadata") or {}
            if not label_selector.matches(meta.get("labels") or {}):
                return False
            return field_selector.empty or field_selector.matches(_field_values(resource, obj))

        return matches

    # --- writes ---------------------------------------------------------------------------

    def create(
        self,
        resource: ResourceType,
        namespace: str,
        body: Any,
        *,
        manager: str,
        dry_run: bool = False,
        strict: bool = False,
        apply_by: str | None = None,
    ) -> Write:
        obj = _object_body(resource, body)
        meta = obj.setdefault("metadata", {})
        _check_namespace(resource, namespace, meta)
        name = meta.get("name") or ""
        if not name and meta.get("generateName"):
            name = meta["generateName"] + "".join(secrets.choice(_SUFFIX) for _ in range(5))
        if not name:
            raise invalid(
                resource, "", "metadata.name", "Required value: name or generateName is required"
            )
        with self.lock:
            objects = self._objects.setdefault(resource.storage, {})
            if (namespace, name) in objects:
                raise ApiError(
                    409,
                    "AlreadyExists",
                    f'{resource.qualified} "{name}" already exists',
                    _details(resource, name),
                )
            for key in (
                "resourceVersion",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "managedFields",
            ):
                meta.pop(key, None)
            meta.update(
                name=name, uid=str(uuid.uuid4()), creationTimestamp=self.now(), generation=1
            )
            if resource.namespaced:
                meta["namespace"] = namespace
            if resource.status:
                obj.pop("status", None)
            if apply_by is not None:
                system = {k: v for k, v in meta.items() if k in managed.SYSTEM_METADATA}
                shell = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": system}
                part = False if resource.status else None
                obj = managed.apply(
                    shell, obj, apply_by, True, part, resource.group_version, self.now()
                )
            else:
                managed.record_update(None, obj, manager, None, resource.group_version, self.now())
            warnings = self._admit(resource, obj, strict)
            if resource.storage == CRDS:
                obj["status"] = established(obj, self.now())
            if not dry_run:
                self._commit(resource, namespace, name, None, obj)
            return Write(_presented(resource, obj), created=True, warnings=warnings)

    def update(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        body: Any,
        *,
        manager: str,
        status: bool = False,
        dry_run: bool = False,
        strict: bool = False,
    ) -> Write:
        obj = _object_body(resource, body)
        meta = obj.setdefault("metadata", {})
        _check_namespace(resource, namespace, meta)
        if meta.get("name") not in (None, "", name):
            raise ApiError(
                400, "BadRequest", "the name of the object does not match the name on the URL"
            )
        with self.lock:
            old = self._existing(resource, namespace, name)
            wanted = meta.get("resourceVersion")
            if wanted and wanted != old["metadata"]["resourceVersion"]:
                raise conflict(resource, name)
            return self._replace(
                resource, namespace, name, old, obj, manager, status, dry_run, strict
            )

    def patch(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        kind: str,
        body: Any,
        *,
        manager: str,
        force: bool = False,
        status: bool = False,
        dry_run: bool = False,
        strict: bool = False,
    ) -> Write:
        if kind != JSON_PATCH and not isinstance(body, dict):
            raise ApiError(400, "BadRequest", f"a {kind} patch must be a JSON object")
        if kind == APPLY and not manager:
            raise ApiError(
                422,
                "Invalid",
                'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
                "is required for apply patch",
            )
        with self.lock:
            old = self._objects.get(resource.storage, {}).get((namespace, name))
            if old is None:
                if kind != APPLY or status:
                    raise not_found(resource, name)
                applied = dict(body)
                applied.setdefault("metadata", {})["name"] = name
                return self.create(
                    resource,
                    namespace,
                    applied,
                    manager=manager,
                    dry_run=dry_run,
                    strict=strict,
                    apply_by=manager,
                )
            if isinstance(body, dict):
                wanted = (body.get("metadata") or {}).get("resourceVersion")
                if wanted and wanted != old["metadata"]["resourceVersion"]:
                    raise conflict(resource, name)
            current = _presented(resource, old)
            try:
                if kind == JSON_PATCH:
                    patched = json_patch(current, body)
                elif kind == APPLY:
                    _check_namespace(resource, namespace, body.setdefault("metadata", {}))
                    patched = managed.apply(
                        current,
                        body,
                        manager,
                        force,
                        status if resource.status else None,
                        resource.group_version,
                        self.now(),
                    )
                else:
                    patched = merge_patch(current, body)
            except managed.ApplyConflict as error:
                raise conflict(resource, name, str(error)) from None
            except PatchError as error:
                reason = "Invalid" if error.status == 422 else "BadRequest"
                raise ApiError(error.status, reason, str(error)) from None
            if not isinstance(patched, dict):
                raise ApiError(422, "Invalid", "the patched object is not a JSON object")
            patched.setdefault("metadata", {})["name"] = name
            tracked = None if kind == APPLY else manager
            return self._replace(
                resource, namespace, name, old, patched, tracked, status, dry_run, strict
            )

    def delete(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        options: dict[str, Any] | None = None,
        *,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        options = options or {}
        with self.lock:
            old = self._existing(resource, namespace, name)
            preconditions = options.get("preconditions") or {}
            meta = old["metadata"]
            if preconditions.get("uid") and preconditions["uid"] != meta["uid"]:
                raise conflict(
                    resource,
                    name,
                    f"Precondition failed: UID in precondition: {preconditions['uid']}, "
                    f"UID in object meta: {meta['uid']}",
                )
            if (
                preconditions.get("resourceVersion")
                and preconditions["resourceVersion"] != meta["resourceVersion"]
            ):
                raise conflict(resource, name)
            grace = self._grace(resource, old, options)
            if meta.get("finalizers") or grace:
                if meta.get("deletionTimestamp"):
                    return _presented(resource, old)
                new = clone(old)
                new_meta = new["metadata"]
                new_meta["deletionTimestamp"] = format_rfc3339(
                    self._now() + timedelta(seconds=grace)
                )
                new_meta["deletionGracePeriodSeconds"] = grace
                if not dry_run:
                    self._commit(resource, namespace, name, old, new)
                return _presented(resource, new)
            if dry_run:
                return _presented(resource, old)
            return _presented(resource, self._remove(resource, namespace, name))

    # --- test hooks -----------------------------------------------------------------------

    def compact(self) -> None:
        """Forget the event log: a watch from any version held so far gets 410."""
        with self.lock:
            self.rv += 1
            self.compacted = self.rv
            self._events.clear()
            self._rvs.clear()
            self.changed.notify_all()

    def expire_watches(self) -> None:
        with self.lock:
            self.expired += 1
            self.changed.notify_all()

    def drop_watches(self) -> None:
        with self.lock:
            self.dropped += 1
            self.changed.notify_all()

    # --- watches --------------------------------------------------------------------------

    def events_after(self, cursor: int) -> list[Event]:
        """Events newer than ``cursor`` (call with the lock held); ApiError 410 when the
        log no longer reaches back to it."""
        if cursor < self.compacted:
            raise ApiError(410, "Expired", f"too old resource version: {cursor} ({self.compacted})")
        start = bisect.bisect_right(self._rvs, cursor)
        return self._events[start:]

    def encode(self, resource: ResourceType, event: Event) -> bytes:
        cached = event.encoded.get(resource.group_version)
        if cached is None:
            cached = json.dumps(_presented(resource, event.new), separators=(",", ":")).encode()
            event.encoded[resource.group_version] = cached
        return cached

    # --- internals ------------------------------------------------------------------------

    def _existing(self, resource: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        old = self._objects.get(resource.storage, {}).get((namespace, name))
        if old is None:
            raise not_found(resource, name)
        return old

    def _replace(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        old: dict[str, Any],
        obj: dict[str, Any],
        manager: str | None,
        status: bool,
        dry_run: bool,
        strict: bool,
    ) -> Write:
        new = _merged_write(resource, old, obj, status)
        if manager is not None:
            part = status if resource.status else None
            managed.record_update(old, new, manager, part, resource.group_version, self.now())
        warnings = self._admit(resource, new, strict)
        if _spec_of(new) != _spec_of(old):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        if resource.storage == CRDS:
            same = _spec_of(new) == _spec_of(old) and "status" in old
            new["status"] = old["status"] if same else established(new, self.now())
        if _content(new) == _content(old):
            return Write(_presented(resource, old), warnings=warnings)
        if dry_run:
            return Write(_presented(resource, new), warnings=warnings)
        meta = new["metadata"]
        if (
            meta.get("deletionTimestamp")
            and not meta.get("finalizers")
            and not _grace_pending(meta, self._now())
        ):
            # The last finalizer is gone: one DELETED event, carrying this last state.
            self._objects[resource.storage][(namespace, name)] = new
            return Write(
                _presented(resource, self._remove(resource, namespace, name)), warnings=warnings
            )
        self._commit(resource, namespace, name, old, new)
        return Write(_presented(resource, new), warnings=warnings)

    def _admit(self, resource: ResourceType, obj: dict[str, Any], strict: bool) -> list[str]:
        name = (obj.get("metadata") or {}).get("name", "")
        if resource.schema is not None and not _NAME.fullmatch(name):
            raise invalid(resource, name, "metadata.name", "a lowercase RFC 1123 subdomain")
        try:
            pruned = admit(resource, obj, strict)
        except SchemaError as error:
            if error.problem.startswith("field not declared"):
                raise ApiError(
                    400,
                    "BadRequest",
                    f'{resource.kind} in version "{resource.version}" cannot be handled as a '
                    f'{resource.kind}: strict decoding error: unknown field "{error.field}"',
                ) from None
            raise invalid(resource, name, error.field, error.problem) from None
        if resource.model is not None:
            try:
                _models.deserialize(json.dumps(obj), resource.model, "application/json")
            except (ValidationError, ValueError, TypeError) as error:
                raise invalid(resource, name, resource.kind, " ".join(str(error).split())) from None
        if resource.storage == CRDS:
            try:
                crd_resources(obj)
            except SchemaError as error:
                raise invalid(resource, name, error.field, error.problem) from None
        return [f'unknown field "{p}"' for p in pruned]

    def _commit(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        old: dict[str, Any] | None,
        new: dict[str, Any],
    ) -> None:
        self.rv += 1
        new["metadata"]["resourceVersion"] = str(self.rv)
        new.setdefault("apiVersion", resource.group_version)
        new.setdefault("kind", resource.kind)
        self._objects.setdefault(resource.storage, {})[(namespace, name)] = new
        self._record(
            Event(self.rv, resource.storage, namespace, "MODIFIED" if old else "ADDED", old, new)
        )
        if resource.storage == CRDS:
            self._register(new)

    def _remove(self, resource: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        old = self._objects[resource.storage].pop((namespace, name))
        self.rv += 1
        gone = clone(old)
        gone["metadata"]["resourceVersion"] = str(self.rv)
        self._record(Event(self.rv, resource.storage, namespace, "DELETED", old, gone))
        if resource.storage == CRDS:
            self._unregister(old)
        return gone

    def _record(self, event: Event) -> None:
        self._events.append(event)
        self._rvs.append(event.rv)
        if len(self._events) > 2 * self.history:
            cut = len(self._events) - self.history
            self.compacted = self._events[cut - 1].rv
            del self._events[:cut]
            del self._rvs[:cut]
        self._dirty = True
        self.changed.notify_all()

    def _register(self, crd: dict[str, Any]) -> None:
        try:
            for resource in crd_resources(crd):
                self.registry.add(resource)
        except SchemaError as error:  # refused at admission; a stored bad CRD is skipped
            log.warning("CRD %s is not served: %s", crd["metadata"].get("name"), error)

    def _unregister(self, crd: dict[str, Any]) -> None:
        spec = crd.get("spec") or {}
        storage = (spec.get("group", ""), (spec.get("names") or {}).get("plural", ""))
        resource = self.registry.any_version(storage)
        if resource is not None:
            for namespace, name in list(self._objects.get(storage, {})):
                self._remove(resource, namespace, name)
        self.registry.remove_storage(storage)

    def _grace(self, resource: ResourceType, obj: dict[str, Any], options: dict[str, Any]) -> int:
        """Pods wait out their grace period (there is no kubelet to end them sooner)."""
        if resource.storage != ("", "pods"):
            return 0
        grace = options.get("gracePeriodSeconds")
        if grace is None:
            grace = (obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        return max(0, int(grace))

    def _reap(self) -> None:
        now = self._now()
        for storage, objects in list(self._objects.items()):
            for (namespace, name), obj in list(objects.items()):
                meta = obj["metadata"]
                if (
                    meta.get("deletionTimestamp")
                    and not meta.get("finalizers")
                    and not _grace_pending(meta, now)
                ):
                    resource = self.registry.any_version(storage)
                    if resource is not None:
                        self._remove(resource, namespace, name)

    def _seed(self) -> None:
        """What every cluster has: the default namespaces and the bootstrap roles."""
        for obj in _BOOTSTRAP:
            resource = self.registry.of_kind(obj["apiVersion"], obj["kind"])
            assert resource is not None
            meta = obj["metadata"]
            if (meta.get("namespace", ""), meta["name"]) not in self._objects.get(
                resource.storage, {}
            ):
                self.create(
                    resource,
                    meta.get("namespace", ""),
                    clone(obj),
                    manager="kube-apiserver",
                )

    # --- the state file -------------------------------------------------------------------

    def flush(self) -> None:
        if self.state is None:
            return
        with self.lock:
            if not self._dirty:
                return
            self._dirty = False
            document = {
                "resourceVersion": self.rv,
                "objects": [
                    {"group": storage[0], "plural": storage[1], "object": obj}
                    for storage, objects in self._objects.items()
                    for obj in objects.values()
                ],
            }
        text = json.dumps(document, separators=(",", ":"))
        descriptor, scratch = tempfile.mkstemp(prefix=".kubeapi-", dir=self.state.parent)
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
                stream.write(text)
            os.replace(scratch, self.state)
        except BaseException:
            Path(scratch).unlink(missing_ok=True)
            raise

    def _load(self, path: Path) -> None:
        document = json.loads(path.read_text(encoding="utf-8"))
        self.rv = int(document["resourceVersion"])
        rows = document["objects"]
        # CRDs first: they make the other kinds servable.
        for row in sorted(rows, key=lambda r: (r["group"], r["plural"]) != CRDS):
            obj = row["object"]
            meta = obj["metadata"]
            storage = (row["group"], row["plural"])
            self._objects.setdefault(storage, {})[(meta.get("namespace", ""), meta["name"])] = obj
            if storage == CRDS:
                self._register(obj)


def _object_body(resource: ResourceType, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "BadRequest", f"the request body must be a {resource.kind} object")
    api_version = body.get("apiVersion")
    kind = body.get("kind")
    if api_version not in (None, "", resource.group_version) or kind not in (
        None,
        "",
        resource.kind,
    ):
        raise ApiError(
            400,
            "BadRequest",
            f"the body is {api_version}/{kind}, the URL names "
            f"{resource.group_version}/{resource.kind}",
        )
    obj = clone(body)
    obj["apiVersion"] = resource.group_version
    obj["kind"] = resource.kind
    if not isinstance(obj.get("metadata", {}), dict):
        raise ApiError(400, "BadRequest", "metadata must be an object")
    return obj


def _check_namespace(resource: ResourceType, namespace: str, meta: dict[str, Any]) -> None:
    if not resource.namespaced:
        meta.pop("namespace", None)
        return
    if meta.get("namespace") not in (None, "", namespace):
        raise ApiError(
            400,
            "BadRequest",
            "the namespace of the provided object does not match the namespace sent on the request",
        )


def _merged_write(
    resource: ResourceType, old: dict[str, Any], obj: dict[str, Any], status: bool
) -> dict[str, Any]:
    """The stored object after a write: immutable metadata kept; with a status
    subresource, a main write keeps the old status and a status write changes only it."""
    if resource.status and status:
        new = clone(old)
        if "status" in obj:
            new["status"] = clone(obj["status"])
        else:
            new.pop("status", None)
        new["metadata"]["managedFields"] = (obj.get("metadata") or {}).get(
            "managedFields", old["metadata"].get("managedFields")
        )
        return new
    new = clone(obj)
    new["apiVersion"] = resource.group_version
    new["kind"] = resource.kind
    meta = new.setdefault("metadata", {})
    for key in (
        "uid",
        "creationTimestamp",
        "namespace",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
    ):
        if key in old["metadata"]:
            meta[key] = old["metadata"][key]
        else:
            meta.pop(key, None)
    meta["resourceVersion"] = old["metadata"]["resourceVersion"]
    if resource.status:
        if "status" in old:
            new["status"] = old["status"]
        else:
            new.pop("status", None)
    return new


def _spec_of(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _content(obj: dict[str, Any]) -> Any:
    meta = dict(obj.get("metadata") or {})
    meta.pop("resourceVersion", None)
    meta["managedFields"] = [
        {k: v for k, v in entry.items() if k != "time"} for entry in meta.get("managedFields") or []
    ]
    return {**{k: v for k, v in obj.items() if k != "apiVersion"}, "metadata": meta}


def _grace_pending(meta: dict[str, Any], now: datetime) -> bool:
    stamp = meta.get("deletionTimestamp")
    if not stamp or not meta.get("deletionGracePeriodSeconds"):
        return False
    return parse_rfc3339(str(stamp)) > now


def _presented(resource: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
    if obj.get("apiVersion") == resource.group_version:
        return obj
    return {**obj, "apiVersion": resource.group_version}


def _field_values(resource: ResourceType, obj: dict[str, Any]) -> dict[str, str]:
    meta = obj.get("metadata") or {}
    values = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
    }
    if "spec.nodeName" in resource.fields:
        values["spec.nodeName"] = (obj.get("spec") or {}).get("nodeName", "")
        values["status.phase"] = (obj.get("status") or {}).get("phase", "")
    return values


_BOOTSTRAP: tuple[dict[str, Any], ...] = (
    *(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
        for n in ("default", "kube-system", "kube-public")
    ),
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "cluster-admin"},
        "rules": [
            {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
            {"nonResourceURLs": ["*"], "verbs": ["*"]},
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "system:discovery"},
        "rules": [
            {
                "nonResourceURLs": [
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/openapi",
                    "/openapi/*",
                    "/version",
                    "/version/",
                    "/healthz",
                    "/livez",
                    "/readyz",
                ],
                "verbs": ["get"],
            }
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "system:discovery"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "system:discovery",
        },
        "subjects": [
            {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Group",
                "name": "system:authenticated",
            }
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "system:auth-delegator"},
        "rules": [
            {
                "apiGroups": ["authentication.k8s.io"],
                "resources": ["tokenreviews"],
                "verbs": ["create"],
            },
            {
                "apiGroups": ["authorization.k8s.io"],
                "resources": ["subjectaccessreviews"],
                "verbs": ["create"],
            },
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {
            "name": "extension-apiserver-authentication-reader",
            "namespace": "kube-system",
        },
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": ["extension-apiserver-authentication"],
                "verbs": ["get", "list", "watch"],
            }
        ],
    },
)

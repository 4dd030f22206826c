"""Create: what a submitted Sandbox asks the store to claim, and the object answered.

A create is a claim, never an upsert: nothing is stored, and creating a name that is
already claimed asks for a second claim (which the fleet may grant on another node).

The claim is read from the submitted object:

* name: ``metadata.name``, else ``metadata.generateName`` plus five random characters;
* template: the first container's image (``spec.podTemplate.spec.containers[0].image``),
  the pool-key rule the warm-pool driver and e2b share; the template annotation is not
  read, so there is one way to say it;
* net: the ``sandbox.cocoonstack.io/net`` annotation on the object, else on the pod
  template, else ``none``; any other value than ``none`` or ``egress`` is 422;
* size: the first container's requests (else its limits): above 4 CPU or 8Gi is
  ``large``, above 1 CPU or 2Gi ``medium``, else ``small``;
* ttl: ``spec.shutdownTime`` when set (rounded up to whole seconds; a time not in the
  future is refused), else the ``sandbox.cocoonstack.io/ttl-seconds`` annotation, else the
  node's default.

Names, namespaces, labels and annotations are checked as Kubernetes checks them (a
namespace is an RFC 1123 label, annotations hold at most 256 KiB), and each failure is a
422 ``Invalid`` whose ``details.causes`` name the field.
"""

from __future__ import annotations

import copy
import json
import math
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from sandboxctl.apiserver.discovery import GROUP, PLURAL
from sandboxctl.apiserver.status import ApiError
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.model import NETS, PoolKey
from sandboxctl.core.sandboxes import (
    ANNOTATION_CLAIM_ID,
    ANNOTATION_DEADLINE,
    API_VERSION,
    CONDITION_READY,
    KIND,
    LABEL_NODE,
    addr_host,
)
from sandboxctl.core.timestamps import format_rfc3339, parse_rfc3339
from sandboxctl.store import Assignment

ANNOTATION_NET: Final = "sandbox.cocoonstack.io/net"
ANNOTATION_TTL_SECONDS: Final = "sandbox.cocoonstack.io/ttl-seconds"
ANNOTATION_ADDRESS: Final = "sandbox.cocoonstack.io/address"

READY_ON_CREATE: Final = "DependenciesReady"

LARGE_CPU, LARGE_MEMORY = Decimal(4), Decimal(8 * 2**30)
MEDIUM_CPU, MEDIUM_MEMORY = Decimal(1), Decimal(2 * 2**30)

_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME_MAX: Final = 253
_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_MAX: Final = 63
_QUALIFIED: Final = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LABEL_VALUE: Final = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
ANNOTATIONS_MAX_BYTES: Final = 256 * 1024  # all keys and values together, as Kubernetes
_SHOWN: Final = 64  # characters of a bad value quoted back
_SUFFIX_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"  # what the API server draws from
_QUANTITY: Final = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>[eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?"
)
_BINARY: Final = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL: Final = {
    "n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class CreateRequest:
    namespace: str
    name: str
    key: PoolKey
    ttl_seconds: int


def create_request(namespace: str, body: Any, now: datetime) -> CreateRequest:
    """Read a submitted Sandbox; ApiError 400/422 names the field that is wrong."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a Sandbox object")
    for field, expected in (("apiVersion", API_VERSION), ("kind", KIND)):
        if body.get(field) not in (None, "", expected):
            raise ApiError(400, f"{field} {body[field]!r} is not {expected!r}")
    metadata = _mapping(body, "metadata")
    check_namespace(namespace)
    if metadata.get("namespace") not in (None, "", namespace):
        raise ApiError(
            400,
            "the namespace of the provided object does not match the namespace sent on "
            f"the request ({metadata['namespace']!r} vs {namespace!r})",
        )
    spec = _mapping(body, "spec")
    pod = _mapping(spec, "podTemplate", "spec.")
    containers = _mapping(pod, "spec", "spec.podTemplate.").get("containers") or []
    if not isinstance(containers, list) or not containers or not isinstance(containers[0], dict):
        raise _invalid(
            "spec.podTemplate.spec.containers",
            "Required value: one container",
            "FieldValueRequired",
        )
    first = containers[0]
    image = first.get("image")
    if not isinstance(image, str) or not image:
        raise _invalid(
            "spec.podTemplate.spec.containers[0].image",
            "Required value: the template to claim from",
            "FieldValueRequired",
        )
    annotations = _annotations(metadata, "metadata")
    pod_metadata = _mapping(pod, "metadata", "spec.podTemplate.")
    pod_annotations = _annotations(pod_metadata, "spec.podTemplate.metadata")
    _labels(metadata, "metadata")
    _labels(pod_metadata, "spec.podTemplate.metadata")
    net = annotations.get(ANNOTATION_NET) or pod_annotations.get(ANNOTATION_NET)
    if net and net not in NETS:
        where = "metadata" if annotations.get(ANNOTATION_NET) else "spec.podTemplate.metadata"
        raise _invalid(
            f"{where}.annotations[{ANNOTATION_NET}]",
            f"Unsupported value: {_shown(net)}: supported values: "
            + ", ".join(f'"{n}"' for n in NETS),
            "FieldValueNotSupported",
        )
    key = PoolKey.of(image, net, pool_size(first))
    return CreateRequest(namespace, _name(metadata), key, _ttl(spec, annotations, now))


def pool_size(container: dict[str, Any]) -> str:
    """``small``, ``medium`` or ``large`` from a container's requests, else its limits."""
    resources = container.get("resources") or {}
    if not isinstance(resources, dict):
        raise _invalid("spec.podTemplate.spec.containers[0].resources", "must be an object")
    amounts = resources.get("requests") or resources.get("limits") or {}
    if not isinstance(amounts, dict):
        raise _invalid("spec.podTemplate.spec.containers[0].resources", "must map to amounts")
    cpu = _quantity(amounts.get("cpu"), "cpu")
    memory = _quantity(amounts.get("memory"), "memory")
    if cpu > LARGE_CPU or memory > LARGE_MEMORY:
        return "large"
    if cpu > MEDIUM_CPU or memory > MEDIUM_MEMORY:
        return "medium"
    return "small"


def parse_quantity(text: str) -> Decimal:
    """A Kubernetes resource quantity (``500m``, ``1.5``, ``2Gi``, ``1e9``) as a number."""
    match = _QUANTITY.fullmatch(text.strip())
    if match is None:
        raise InvalidValueError(f"quantity {text!r} is not a Kubernetes quantity (e.g. 500m, 2Gi)")
    number = Decimal(match["number"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * Decimal(1024 ** _BINARY[suffix])
    if suffix in _DECIMAL:
        return number.scaleb(_DECIMAL[suffix])
    try:
        return number.scaleb(int(suffix[1:]))
    except (ValueError, InvalidOperation) as error:
        raise InvalidValueError(f"quantity {text!r} has a bad exponent") from error


def created_object(
    request: CreateRequest,
    body: dict[str, Any],
    granted: Assignment,
    now: datetime,
    resource_version: str,
) -> dict[str, Any]:
    """The submitted object as created: now, where it runs, Ready, and the version the
    store gave the create (so a client can watch from it). No uid: no read carries one."""
    obj = copy.deepcopy(body)
    obj["apiVersion"], obj["kind"] = API_VERSION, KIND
    metadata = dict(obj.get("metadata") or {})
    metadata.pop("uid", None)
    metadata.update(
        name=request.name,
        namespace=request.namespace,
        resourceVersion=resource_version,
        creationTimestamp=format_rfc3339(now),
    )
    metadata["labels"] = {**(metadata.get("labels") or {}), LABEL_NODE: granted.node}
    annotations = dict(metadata.get("annotations") or {})
    annotations[ANNOTATION_CLAIM_ID] = granted.claim_id
    annotations[ANNOTATION_ADDRESS] = granted.address
    if granted.deadline:
        annotations[ANNOTATION_DEADLINE] = granted.deadline
    metadata["annotations"] = annotations
    obj["metadata"] = metadata
    status: dict[str, Any] = {"nodeName": granted.node}
    host = addr_host(granted.address)
    if host:
        status["podIPs"] = [{"ip": host}]
    status["conditions"] = [
        {
            "type": CONDITION_READY,
            "status": "True",
            "reason": READY_ON_CREATE,
            "message": f'claimed on node "{granted.node}" as {granted.claim_id}',
        }
    ]
    obj["status"] = status
    return obj


def check_namespace(namespace: str) -> None:
    """422 unless ``namespace`` is an RFC 1123 label, as Kubernetes names namespaces."""
    if len(namespace) > _LABEL_MAX or not _LABEL.fullmatch(namespace):
        raise _invalid(
            "metadata.namespace",
            f"Invalid value: {_shown(namespace)}: a lowercase RFC 1123 label of at most "
            f"{_LABEL_MAX} characters must consist of lower case alphanumeric characters or "
            "'-', and must start and end with an alphanumeric character",
        )


def unknown_template(image: str) -> ApiError:
    """The 422 for a template no fresh node serves."""
    return _invalid(
        "spec.podTemplate.spec.containers[0].image",
        f"Not found: {_shown(image)}: no node serves this template",
        "FieldValueNotFound",
    )


def _name(metadata: dict[str, Any]) -> str:
    name = metadata.get("name")
    if not name:
        prefix = metadata.get("generateName")
        if not prefix:
            raise _invalid(
                "metadata.name",
                "Required value: name or generateName is required",
                "FieldValueRequired",
            )
        if not isinstance(prefix, str):
            raise _invalid("metadata.generateName", "must be a string")
        name = prefix + "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(5))
    if not isinstance(name, str) or len(name) > _NAME_MAX or not _NAME.fullmatch(name):
        raise _invalid(
            "metadata.name",
            f"Invalid value: {_shown(name)}: a lowercase RFC 1123 subdomain of at most "
            f"{_NAME_MAX} characters must consist of lower case alphanumeric characters, '-' "
            "or '.', and must start and end with an alphanumeric character",
        )
    return name


def _ttl(spec: dict[str, Any], annotations: dict[str, str], now: datetime) -> int:
    shutdown = spec.get("shutdownTime")
    if shutdown not in (None, ""):
        if not isinstance(shutdown, str):
            raise ApiError(400, "spec.shutdownTime must be an RFC 3339 time")
        try:
            at = parse_rfc3339(shutdown)
        except InvalidValueError as error:
            raise ApiError(400, f"spec.shutdownTime: {error}") from None
        seconds = math.ceil((at - now).total_seconds())
        if seconds <= 0:
            raise ApiError(400, f"spec.shutdownTime {shutdown} is not in the future")
        return seconds
    text = annotations.get(ANNOTATION_TTL_SECONDS)
    if text is None or text == "":
        return 0
    if not text.isascii() or not text.isdigit():
        raise ApiError(
            400, f"annotation {ANNOTATION_TTL_SECONDS} {text!r}: expected whole seconds, e.g. 300"
        )
    return int(text)


def _mapping(parent: dict[str, Any], field: str, path: str = "") -> dict[str, Any]:
    value = parent.get(field)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ApiError(400, f"{path}{field} must be an object")
    return value


def _annotations(metadata: dict[str, Any], where: str) -> dict[str, str]:
    annotations = metadata.get("annotations") or {}
    if not isinstance(annotations, dict) or not all(
        isinstance(v, str) for v in annotations.values()
    ):
        raise ApiError(400, f"{where}.annotations must map strings to strings")
    for key in annotations:
        _qualified_key(key, f"{where}.annotations")
    size = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
    if size > ANNOTATIONS_MAX_BYTES:
        raise _invalid(
            f"{where}.annotations",
            f"Too long: must have at most {ANNOTATIONS_MAX_BYTES} bytes",
            "FieldValueTooLong",
        )
    return annotations


def _labels(metadata: dict[str, Any], where: str) -> None:
    labels = metadata.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise ApiError(400, f"{where}.labels must map strings to strings")
    for key, value in labels.items():
        _qualified_key(key, f"{where}.labels")
        if len(value) > _LABEL_MAX or not _LABEL_VALUE.fullmatch(value):
            raise _invalid(
                f"{where}.labels",
                f"Invalid value: {_shown(value)}: a label value has at most {_LABEL_MAX} "
                "characters, alphanumeric, '-', '_' or '.', starting and ending alphanumeric",
            )


def _qualified_key(key: str, where: str) -> None:
    """A label or annotation key: an optional DNS-subdomain prefix and '/', then a name
    of at most 63 characters."""
    prefix, slash, name = key.rpartition("/")
    good = (
        0 < len(name) <= _LABEL_MAX
        and bool(_QUALIFIED.fullmatch(name))
        and (not slash or (0 < len(prefix) <= _NAME_MAX and bool(_NAME.fullmatch(prefix))))
    )
    if not good:
        raise _invalid(
            where,
            f"Invalid value: {_shown(key)}: a key is a name of at most {_LABEL_MAX} "
            "alphanumeric characters, '-', '_' or '.', optionally after a DNS subdomain "
            "prefix and '/'",
        )


def _shown(value: str) -> str:
    """A value as a message quotes it: at most a few dozen characters."""
    text = value if len(value) <= _SHOWN else value[:_SHOWN] + "..."
    return json.dumps(text)


def _quantity(value: object, resource: str) -> Decimal:
    if value is None:
        return Decimal(0)
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise _invalid(f"resources {resource}", f"{value!r} is not a quantity")
    try:
        return parse_quantity(str(value))
    except InvalidValueError as error:
        raise _invalid(f"resources {resource}", str(error)) from None


def _invalid(field: str, problem: str, reason: str = "FieldValueInvalid") -> ApiError:
    cause = {"reason": reason, "message": problem, "field": field}
    return ApiError(
        422,
        f"Sandbox is invalid: {field}: {problem}",
        details={"kind": PLURAL, "group": GROUP, "causes": [cause]},
    )
